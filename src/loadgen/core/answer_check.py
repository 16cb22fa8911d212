"""Whether a constrained answer is what was asked for: the rule, pure (text in, verdict out).

A request that asks for structured output (a JSON schema, or a GBNF grammar) or offers tools gets
its answer judged once it has ended:
    cut at the length asked (`stop_type: limit`, `finish_reason: length`)  → not judged (None):
        the grammar had no chance to close the answer; counted apart (`answers_cut` and the
        level's count of judged answers), never as broken
    a JSON schema: the text parses as JSON and the schema's validator finds no error → valid
    a grammar without a schema: the server's sampler enforces it, so the answer is valid when it
        ended by itself (loadgen holds no GBNF parser); a non-empty answer is all that is checked
    tools: every `tool_calls` entry names an offered tool and its `arguments` parse as a JSON
        object that matches that tool's `parameters` schema → valid; no tool call → not judged
A broken answer is the failure `invalid_output`, its message naming what failed (first error).

jsonschema is imported when the first answer is judged, so a run without a check never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from .records import INVALID_OUTPUT

__all__ = ["INVALID_OUTPUT", "AnswerCheck", "ToolCall", "judge_json"]

LIMIT_STOPS = frozenset({"limit", "length", "max_tokens"})  # stop_type / finish_reason of an answer cut at length


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call as the server sent it: the function's name and its arguments text."""

    name: str | None
    arguments: str | None


@dataclass(frozen=True)
class AnswerCheck:
    """What a run's answers are judged against: a JSON schema, a grammar, tools (name → parameters schema)."""

    schema: dict[str, Any] | None = None
    grammar: bool = False
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    _validators: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def validator(self, key: str, schema: dict[str, Any]) -> Any:
        """The schema's validator, made once (its class chosen by the schema's `$schema`)."""
        v = self._validators.get(key)
        if v is None:
            import jsonschema

            v = self._validators[key] = jsonschema.validators.validator_for(schema)(schema)
        return v

    def judge(self, text: str, calls: list[ToolCall], stop: str | None) -> str | None | bool:
        """True: valid; a message: broken (why); None: not judged (cut at length, or nothing to judge)."""
        if stop in LIMIT_STOPS:
            return None
        if calls and self.tools:
            return self.judge_calls(calls)
        if self.schema is not None:
            return judge_json(text, self.validator("", self.schema))
        if self.grammar:
            return True if text else "the answer is empty"
        return None

    def judge_calls(self, calls: list[ToolCall]) -> str | bool:
        for call in calls:
            if call.name not in self.tools:
                return f"tool call names no offered tool: {call.name!r}"
            schema = self.tools[call.name]
            verdict = judge_json(call.arguments or "", self.validator(call.name, schema) if schema else None,
                                 what=f"tool {call.name}'s arguments")
            if verdict is not True:
                return verdict
        return True


def judge_json(text: str, validator: Any, what: str = "the answer") -> str | bool:
    """True when `text` is JSON that `validator` (None: any JSON) accepts; else the one-line reason."""
    try:
        value = msgspec.json.decode(text.encode())
    except msgspec.DecodeError as exc:
        return f"{what}: not JSON ({exc}): {_snippet(text)}"
    if validator is None:
        return True
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return True
    where = "/".join(str(p) for p in error.absolute_path) or "top level"
    return f"{what}: no match for the schema at {where}: {error.message[:160]}"


def _snippet(text: str, limit: int = 80) -> str:
    text = text.replace("\n", " ")
    return repr(text[:limit] + ("…" if len(text) > limit else ""))
