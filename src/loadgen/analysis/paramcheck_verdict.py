"""Did the gateway pass my parameters? The canary values, what to read back, and the verdict rule.

`loadgen paramcheck` sends the same canary request to the server directly and through the gateway,
each parameter at a value unlike llama-server's default. After each, it reads back what the server
applied: `/slots[i].params` of the task that just ran (read directly from the server), and
`generation_settings` when the answer is a `/completion` one; plus visible effects (the tokens
generated, whether log-probabilities came back). Everything here is pure: it turns those answers
into one verdict per parameter.

The rule for one observation of a parameter, given what the server showed when called directly
(`direct`), through the gateway (`via`) and without the parameter (`default`, from /props):
- nothing seen through the gateway, or nothing directly: no evidence;
- direct equals default: no evidence (the server shows the same with or without it);
- via equals direct: honoured;
- via equals default: dropped;
- anything else: altered.
A parameter's verdict is the worst one its observations give (dropped or altered before honoured:
one sign of a change is enough); with none, "cannot tell".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HONOURED, DROPPED, ALTERED, CANNOT_TELL = "honoured", "dropped", "altered", "cannot tell"
FAILING = (DROPPED, ALTERED)


class _Unseen:
    def __repr__(self) -> str:
        return "UNSEEN"


UNSEEN: Any = _Unseen()  # the server showed nothing for it (a field absent, an endpoint off)

# The canary's value of each checked parameter (OpenAI names), each unlike llama-server's default.
CANARY: dict[str, Any] = {
    "temperature": 0.55, "top_p": 0.87, "top_k": 23, "min_p": 0.07, "seed": 4242, "max_tokens": 7,
    "presence_penalty": 0.3, "frequency_penalty": 0.2, "repeat_penalty": 1.07, "stop": ["<canary-stop>"],
    "logprobs": 2, "logit_bias": {"42": -100}, "reasoning_effort": "high",
    "chat_template_kwargs": {"enable_thinking": True},
}
DEFAULT_PARAMS = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "presence_penalty",
                  "frequency_penalty", "repeat_penalty", "stop")
KNOWN_PARAMS = tuple(CANARY)
# Where llama-server echoes a parameter (generation_settings and /slots params), when it does.
ECHO_KEY = {"max_tokens": "n_predict", "logprobs": "n_probs"}
NOT_IN_SLOTS = ("stop", "logit_bias")  # echoed in generation_settings only
NEVER_ECHOED = ("reasoning_effort", "chat_template_kwargs")  # seen only in the reasoning's length
UNSHOWN = {
    "stop": "llama-server shows it only in /completion's generation_settings (check with --api llamacpp)",
    "logit_bias": "llama-server shows it only in /completion's generation_settings (check with --api llamacpp)",
    "reasoning_effort": "llama-server echoes it nowhere; only a reasoning model's reasoning length would show it",
    "chat_template_kwargs": "llama-server echoes it nowhere; only a reasoning model's reasoning length would show it",
}


@dataclass(frozen=True, slots=True)
class Observation:
    source: str  # "/slots params", "generation_settings", "completion tokens", ...
    direct: Any = UNSEEN
    via: Any = UNSEEN
    default: Any = UNSEEN


@dataclass(frozen=True, slots=True)
class ParamVerdict:
    param: str
    sent: Any
    verdict: str
    evidence: str  # one line: what was seen where

    def to_dict(self) -> dict[str, Any]:
        return {"param": self.param, "sent": self.sent, "verdict": self.verdict, "evidence": self.evidence}


def same(a: Any, b: Any) -> bool:
    """Equal as the server reports values: numbers within float32 rounding, anything else exactly."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)
    return a == b


def judge_observation(obs: Observation) -> str | None:
    """The verdict one observation gives (see the module docstring), or None for no evidence."""
    if obs.via is UNSEEN or obs.direct is UNSEEN:
        return None
    if obs.default is not UNSEEN and same(obs.direct, obs.default):
        return None
    if same(obs.via, obs.direct):
        return HONOURED
    if obs.default is not UNSEEN and same(obs.via, obs.default):
        return DROPPED
    return ALTERED


def judge(param: str, sent: Any, observations: Sequence[Observation]) -> ParamVerdict:
    """One parameter's verdict from all its observations: the worst one given, else cannot tell."""
    judged = [(v, o) for o in observations if (v := judge_observation(o)) is not None]
    if not judged:
        why = "; ".join(f"{o.source}: {_seen(o)}" for o in observations) or "nothing shows it"
        return ParamVerdict(param, sent, CANNOT_TELL, why)
    rank = {DROPPED: 0, ALTERED: 1, HONOURED: 2}
    verdict, obs = min(judged, key=lambda item: rank[item[0]])
    return ParamVerdict(param, sent, verdict, f"{obs.source}: {_seen(obs)}")


def _seen(o: Observation) -> str:
    parts = [f"{name} {_short(value)}" for name, value in (("direct", o.direct), ("via", o.via),
                                                            ("default", o.default)) if value is not UNSEEN]
    return ", ".join(parts) if parts else "not shown"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True, slots=True)
class CanaryAnswer:
    """What one canary request showed: its answer's JSON, and /slots params of its task (read from
    the server directly), either empty when not seen."""

    body: Mapping[str, Any]
    slot_params: Mapping[str, Any]


def observations(param: str, direct: CanaryAnswer, via: CanaryAnswer,
                 defaults: Mapping[str, Any]) -> list[Observation]:
    """Every observation of `param` in the two answers; `defaults` is /props
    default_generation_settings.params."""
    key = ECHO_KEY.get(param, param)
    found = []
    if param not in NEVER_ECHOED and param not in NOT_IN_SLOTS:
        found.append(Observation("/slots params", direct.slot_params.get(key, UNSEEN),
                                 via.slot_params.get(key, UNSEEN), defaults.get(key, UNSEEN)))
    if param not in NEVER_ECHOED:
        direct_gs, via_gs = (a.body.get("generation_settings") for a in (direct, via))
        if isinstance(direct_gs, Mapping) and isinstance(via_gs, Mapping):
            found.append(Observation("generation_settings", direct_gs.get(key, UNSEEN), via_gs.get(key, UNSEEN),
                                     _default_for(param, key, defaults)))
    if param == "max_tokens":
        found.append(Observation("tokens generated", generated_tokens(direct.body), generated_tokens(via.body)))
    if param == "logprobs":
        found.append(Observation("log-probabilities in the answer", has_logprobs(direct.body),
                                 has_logprobs(via.body), False))
    return found


def _default_for(param: str, key: str, defaults: Mapping[str, Any]) -> Any:
    """The value generation_settings shows for a parameter not sent: /props' (stop and logit_bias,
    not in /props params, show empty when not sent)."""
    if key in defaults:
        return defaults[key]
    return {"stop": [], "logit_bias": []}.get(param, UNSEEN)


def generated_tokens(body: Mapping[str, Any]) -> Any:
    """Tokens the server generated for this answer: usage, else tokens_predicted, else UNSEEN."""
    usage = body.get("usage")
    if isinstance(usage, Mapping) and isinstance(usage.get("completion_tokens"), int):
        return usage["completion_tokens"]
    value = body.get("tokens_predicted")
    return value if isinstance(value, int) else UNSEEN


def has_logprobs(body: Mapping[str, Any]) -> Any:
    """Whether the answer carries log-probabilities (OpenAI `logprobs`, llama.cpp `completion_probabilities`)."""
    if "completion_probabilities" in body:
        return bool(body["completion_probabilities"])
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return bool(choices[0].get("logprobs"))
    return UNSEEN if not body else False


def verdicts(params: Sequence[str], direct: CanaryAnswer, via: CanaryAnswer,
             defaults: Mapping[str, Any]) -> list[ParamVerdict]:
    found = []
    for p in params:
        result = judge(p, CANARY[p], observations(p, direct, via, defaults))
        if result.verdict == CANNOT_TELL and p in UNSHOWN:
            result = ParamVerdict(p, result.sent, CANNOT_TELL, UNSHOWN[p])
        found.append(result)
    return found


def exit_code(results: Sequence[ParamVerdict]) -> int:
    """1 when any checked parameter was dropped or altered (so CI fails), else 0."""
    return 1 if any(r.verdict in FAILING for r in results) else 0
