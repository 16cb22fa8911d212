"""What a request asks for beyond text: structured output and tools, as each API spells them.

Fields (checked against llama-server build 11434):
    /completion            `json_schema`: the schema; `grammar`: GBNF text
    /v1/completions        `json_schema` and `grammar` as above (llama-server's own fields: it
                           ignores `response_format` on this endpoint)
    /v1/chat/completions   `response_format: {"type": "json_schema", "json_schema": {"name", "schema"}}`,
                           `grammar`, `tools` (OpenAI's list of `{"type": "function", "function":
                           {...}}`), `tool_choice` ("auto", "required", "none", or
                           `{"type": "function", "function": {"name": NAME}}`); tools need `--jinja`
The fields join the body's other fields, serialised once (`SaltedBodies`): a request's body costs
what a plain one does. A backend whose params ask for any of them judges each answer
(`checked_outcome`, the rule in core/answer_check.py); one that asks for none runs as before.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core import records
from ...core.answer_check import AnswerCheck, ToolCall
from ...core.records import ServerOutcome
from . import GenerationParams

TOOL_CHOICES = ("auto", "required", "none")


def feature_fields(params: GenerationParams, api: str) -> dict[str, Any]:
    """The body fields of the schema, grammar and tools `params` asks for, under `api`'s names."""
    fields: dict[str, Any] = {}
    if params.json_schema is not None:
        if api == "chat":
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "loadgen", "schema": params.json_schema}}
        else:
            fields["json_schema"] = params.json_schema
    if params.grammar is not None:
        fields["grammar"] = params.grammar
    if params.tools:
        fields["tools"] = list(params.tools)
    if params.tool_choice is not None:
        fields["tool_choice"] = (params.tool_choice if params.tool_choice in TOOL_CHOICES
                                 else {"type": "function", "function": {"name": params.tool_choice}})
    return fields


def answer_check(params: GenerationParams) -> AnswerCheck | None:
    """What the answers of `params` are judged against; None when nothing is asked (no check at all)."""
    if not params.checks_answers:
        return None
    tools = {t["function"]["name"]: t["function"].get("parameters") or {} for t in params.tools}
    return AnswerCheck(schema=params.json_schema, grammar=params.grammar is not None, tools=tools)


def checked_outcome(outcome: ServerOutcome, check: AnswerCheck, text: str, calls: list[ToolCall],
                    tools_offered: bool) -> ServerOutcome:
    """A served outcome with its answer judged: `output_valid` set (None: not judged), and a broken
    answer turned into the failure `invalid_output` (its timings and counts kept: the server did the work)."""
    if outcome.error_kind is not None:
        return outcome
    verdict = check.judge(text, calls, outcome.stop_type or outcome.finish_reason)
    n_calls = len(calls) if tools_offered else None
    if verdict is None or verdict is True:
        return msgspec.structs.replace(outcome, output_valid=verdict, tool_calls=n_calls)
    return msgspec.structs.replace(outcome, error_kind=records.INVALID_OUTPUT, error_message=str(verdict)[:300],
                                   output_valid=False, tool_calls=n_calls)


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallPart(msgspec.Struct):
    index: int = 0
    function: _Function | None = None


class _Part(msgspec.Struct):
    """A chat message or stream delta, as far as the answer's text and tool calls go."""

    content: str | None = None
    tool_calls: list[_ToolCallPart] | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    message: _Part | None = None
    delta: _Part | None = None


class _Answer(msgspec.Struct):
    """A whole response or one stream chunk: /completion's `content`, or the OpenAI `choices`."""

    content: str | None = None
    choices: list[_Choice] | None = None


_decode_answer = msgspec.json.Decoder(_Answer).decode


class AnswerParts:
    """An answer's text and tool calls gathered from a whole body or stream chunks (tool-call
    pieces joined by their `index`, as OpenAI streams them)."""

    __slots__ = ("text", "_calls")

    def __init__(self) -> None:
        self.text: list[str] = []
        self._calls: dict[int, list[Any]] = {}  # index -> [name, [argument pieces]]

    def add(self, data: bytes) -> None:
        try:
            answer = _decode_answer(data)
        except msgspec.DecodeError:
            return  # the backend's own reader reports an unreadable body or event
        if answer.content:
            self.text.append(answer.content)
        for choice in (answer.choices or [])[:1]:
            part = choice.message or choice.delta
            if choice.text:
                self.text.append(choice.text)
            if part is None:
                continue
            if part.content:
                self.text.append(part.content)
            for call in part.tool_calls or ():
                name_args = self._calls.setdefault(call.index, [None, []])
                if call.function is not None:
                    name_args[0] = name_args[0] or call.function.name
                    if call.function.arguments:
                        name_args[1].append(call.function.arguments)

    def calls(self) -> list[ToolCall]:
        return [ToolCall(name, "".join(args)) for _, (name, args) in sorted(self._calls.items())]


_CHECKED: dict[type, type] = {}


def checked_reader(base: type, check: AnswerCheck, tools_offered: bool) -> Any:
    """A fresh stream reader of a backend's reader class `base` that also judges its answer when
    the stream ends: an instance of a subclass that gathers the answer (`AnswerParts`) and reads
    every event one by one (no byte-count fast path). The subclass is made once per class."""
    cls = _CHECKED.get(base)
    if cls is None:
        cls = _CHECKED[base] = type(f"Checked{base.__name__}", (base,), {
            "__slots__": ("_parts", "_check", "_tools_offered"), "events": _events, "finish": _finish,
            "count_region": _no_count})
    checked = cls()
    checked._parts, checked._check, checked._tools_offered = AnswerParts(), check, tools_offered
    return checked


def _events(self: Any, payloads: list[bytes]) -> int:
    for data in payloads:
        self._parts.add(data)
    return super(type(self), self).events(payloads)


def _finish(self: Any) -> ServerOutcome:
    outcome = super(type(self), self).finish()
    return checked_outcome(outcome, self._check, "".join(self._parts.text), self._parts.calls(), self._tools_offered)


def _no_count(self: Any, region: bytes) -> None:
    return None


def checked_parse(parse: Any, check: AnswerCheck, tools_offered: bool) -> Any:
    """A backend's `parse` that also judges the answer of a whole (non-streamed) response."""
    def parse_checked(status: int, body: bytes) -> ServerOutcome:
        outcome = parse(status, body)
        if outcome.error_kind is not None:
            return outcome
        parts = AnswerParts()
        parts.add(body)
        return checked_outcome(outcome, check, "".join(parts.text), parts.calls(), tools_offered)
    return parse_checked
