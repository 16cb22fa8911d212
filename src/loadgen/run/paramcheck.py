"""`loadgen paramcheck`'s sequence: the same canary direct and through the gateway, and what the
server applied each time, read from the server directly.

1. Ask the direct server for its defaults (`/props` default_generation_settings.params).
2. Send the canary directly; read `/slots` (the slot of the newest task: the canary's).
3. Send it through the gateway; read the direct server's `/slots` again. No newer task there means
   the gateway does not lead to this server: that is bad input, said in one line.
4. Turn both answers into verdicts (analysis/paramcheck_verdict.py), and note what the gateway changed in
   the answer itself (`model`, `system_fingerprint`, `timings`, headers).

The server should be otherwise idle: another client's task between a canary and its `/slots` read
would be taken for the canary's.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis.paramcheck_verdict import CANARY, CANNOT_TELL, CanaryAnswer, ParamVerdict, verdicts
from ..client.canary import ENDPOINTS, Answer, CanaryClient, CanaryError, applicable, canary_body, last_task
from ..core.baseurl import BaseUrl
from ..core.errors import ConfigError

PROMPT = "Name three colours of the rainbow."
# Response fields and headers that differ between any two answers, whoever sent them.
_VOLATILE_HEADERS = {"date", "content-length", "connection", "keep-alive", "server", "transfer-encoding",
                     "x-request-id"}


class NotAProxy(ConfigError):
    """The via URL does not lead to the direct server (exit 2)."""


@dataclass(slots=True)
class ParamcheckResult:
    api: str
    model: str | None
    results: list[ParamVerdict]
    metadata: list[str] = field(default_factory=list)  # what the gateway changed in the answers

    def to_dict(self) -> dict[str, Any]:
        return {"api": self.api, "model": self.model, "params": [r.to_dict() for r in self.results],
                "metadata": self.metadata}


def run_gateway_check(direct: str, via: str, api: str, params: Sequence[str], *, model: str | None,
                      headers: Mapping[str, str], timeout_s: float, insecure: bool = False) -> ParamcheckResult:
    """`check_gateway` on an event loop of its own, for a command (cli/ runs no event loop)."""
    return asyncio.run(check_gateway(direct, via, api, params, model=model, headers=headers, timeout_s=timeout_s,
                                     insecure=insecure))


async def check_gateway(direct: str, via: str, api: str, params: Sequence[str], *, model: str | None,
                        headers: Mapping[str, str], timeout_s: float, insecure: bool = False) -> ParamcheckResult:
    """Run the canaries (see the module docstring). Raises CanaryError (no usable answer) and
    NotAProxy."""
    async with CanaryClient(headers, timeout_s, insecure) as client:
        props = await client.get(direct, "/props")
        settings = props.body.get("default_generation_settings") if props.status == 200 else None
        defaults = settings.get("params") if isinstance(settings, dict) else None
        if not isinstance(defaults, dict):
            raise ConfigError(f"--direct {BaseUrl.parse(direct).text()}: no llama-server /props there "
                              f"(HTTP {props.status}); give the server's own base URL")
        if api != "llamacpp" and model is None:
            models = await client.get(direct, "/v1/models")
            data = models.body.get("data") if models.status == 200 else None
            model = data[0].get("id") if isinstance(data, list) and data and isinstance(data[0], dict) else None
        asked = {p: CANARY[p] for p in params}
        body = canary_body(api, asked, f"[{uuid.uuid4()}] {PROMPT}", model)
        direct_answer, direct_task = await _send(client, direct, direct, api, body, "--direct")
        via_answer, via_task = await _send(client, via, direct, api, body, "--via")
    if direct_task[0] is not None and (via_task[0] is None or via_task[0] <= direct_task[0]):
        raise NotAProxy(_not_a_proxy(direct, via, direct_answer, via_answer))
    if direct_task[0] is None and _model(via_answer) != _model(direct_answer):
        raise NotAProxy(_not_a_proxy(direct, via, direct_answer, via_answer))
    found = verdicts(params, CanaryAnswer(direct_answer.body, direct_task[1]),
                     CanaryAnswer(via_answer.body, via_task[1]), defaults)
    found = [r if applicable(api, r.param) else
             ParamVerdict(r.param, r.sent, CANNOT_TELL, f"the {api} API has no such field") for r in found]
    return ParamcheckResult(api, model, found, answer_changes(direct_answer, via_answer))


async def _send(client: CanaryClient, url: str, server: str, api: str, body: Mapping[str, Any],
                flag: str) -> tuple[Answer, tuple[int | None, dict[str, Any]]]:
    """One canary to `url`, then the newest task of `server`'s /slots."""
    answer = await client.post(url, ENDPOINTS[api], body)
    if answer.status != 200:
        message = answer.body.get("error")
        detail = message.get("message") if isinstance(message, dict) else message
        raise CanaryError(f"{flag} {BaseUrl.parse(url).text()}: the canary got HTTP {answer.status}"
                          + (f" ({str(detail)[:200]})" if detail else ""))
    return answer, last_task(await client.get(server, "/slots"))


def _model(answer: Answer) -> Any:
    return answer.body.get("model")


def _not_a_proxy(direct: str, via: str, direct_answer: Answer, via_answer: Answer) -> str:
    models = ""
    if _model(direct_answer) != _model(via_answer):
        models = f" (it answers as model {_model(via_answer)!r}, the direct server as {_model(direct_answer)!r})"
    return (f"--via {BaseUrl.parse(via).text()} is not a proxy of --direct {BaseUrl.parse(direct).text()}: "
            f"the canary sent through it never reached the direct server{models}")


def answer_changes(direct: Answer, via: Answer) -> list[str]:
    """What the gateway changed in the answer: fields missing or added, `model` and
    `system_fingerprint` rewritten, response headers added or stripped. One line each."""
    notes = []
    for key in ("model", "system_fingerprint"):
        if key in direct.body and key in via.body and direct.body[key] != via.body[key]:
            notes.append(f"{key} rewritten: {direct.body[key]!r} -> {via.body[key]!r}")
    missing = sorted(set(direct.body) - set(via.body) - {"_json"})
    added = sorted(set(via.body) - set(direct.body) - {"_json"})
    if missing:
        notes.append(f"answer fields missing through the gateway: {', '.join(missing)}")
    if added:
        notes.append(f"answer fields added by the gateway: {', '.join(added)}")
    stripped = sorted(set(direct.headers) - set(via.headers) - _VOLATILE_HEADERS)
    extra = sorted(set(via.headers) - set(direct.headers) - _VOLATILE_HEADERS)
    if stripped:
        notes.append(f"response headers stripped by the gateway: {', '.join(stripped)}")
    if extra:
        notes.append(f"response headers added by the gateway: {', '.join(extra)}")
    return notes
