"""OpenAI's Responses API, `POST /v1/responses`, whole or streamed.

Request: `{"model", "input": "[salt] prompt", "max_output_tokens", ...}`; llama-server honours
`cache_prompt: false` here (checked on build 11434: the same input twice reads 0 cached tokens).

Stream: named events (`event: response.output_text.delta` + `data: {"type": ..., ...}`). Content
events are `response.output_text.delta` (answer) and `response.reasoning_text.delta` /
`response.reasoning_summary_text.delta` (thinking); the stream ends with `response.completed` (or
`response.incomplete`, OpenAI's word for a response cut at `max_output_tokens`) whose `response`
carries `usage`; llama-server adds its `timings` beside it. There is no `[DONE]`. Failures come as
`{"type": "error", "message"}`, `response.failed` (`response.error.message`) or llama-server's own
`{"error": {...}}`.

Tokens: `usage.input_tokens` / `usage.output_tokens` are recorded as the record's `usage`
prompt/completion tokens; `input_tokens_details.cached_tokens` as `cache_n` when no `timings` say it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core import records
from ...core.records import ServerOutcome
from . import GenerationParams, SaltedBodies, generation_fields
from .common import (
    Timings,
    error_message,
    error_outcome,
    reasoning_count,
    served_outcome,
    stream_error,
    truncated,
    undecodable,
)

ANSWER_DELTA = "response.output_text.delta"
REASONING_DELTAS = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
FINAL_EVENTS = frozenset({"response.completed", "response.incomplete"})


class _InputDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None


class _Error(msgspec.Struct):
    message: str | None = None


class _Response(msgspec.Struct):
    """A whole response (non-streaming body, or the `response` of a stream's last event)."""

    status: str | None = None
    usage: _Usage | None = None
    error: Any = None
    output: list[Any] | None = None


class _Event(msgspec.Struct):
    """One stream event, or a whole body: the fields loadgen reads of either."""

    type: str | None = None
    response: _Response | None = None
    timings: Timings | None = None
    message: str | None = None  # {"type": "error", "message": ...}
    # Whole bodies: the response fields sit at the top level.
    status: str | None = None
    usage: _Usage | None = None
    error: Any = None
    output: list[Any] | None = None


_decode = msgspec.json.Decoder(_Event).decode


def outcome(usage: _Usage | None, status: str | None, timings: Timings | None,
            reasoning_events: int = 0) -> ServerOutcome:
    """A served response's outcome: its `usage` in the record's terms, its status as finish_reason."""
    common = None
    cached = reported = None
    if usage is not None:
        total = usage.total_tokens
        if total is None and usage.input_tokens is not None and usage.output_tokens is not None:
            total = usage.input_tokens + usage.output_tokens
        common = records.Usage(usage.input_tokens, usage.output_tokens, total)
        if usage.input_tokens_details is not None:
            cached = usage.input_tokens_details.cached_tokens
        if usage.output_tokens_details is not None:
            reported = usage.output_tokens_details.reasoning_tokens
    return served_outcome(timings, finish_reason=status, usage=common,
                          reasoning_tokens=reasoning_count(reported, reasoning_events), cached_tokens=cached)


class ResponsesBackend:
    name = "responses"
    method = "POST"
    path = "/v1/responses"

    def __init__(self, params: GenerationParams, model: str | None):
        self.params = params
        self.stream = params.stream
        self.model = model
        # ignore_eos and cache_prompt: llama-server's extensions, read on this endpoint too.
        fields = generation_fields(params, "max_output_tokens", **({"model": model} if model is not None else {}))
        if params.reasoning_effort is not None:
            fields["reasoning"] = {"effort": params.reasoning_effort}
        self._bodies = SaltedBodies(b'{"input":', params.prompt_list, b"", fields)
        self.build = self._bodies.build

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:
            return undecodable(status, body, exc)
        if status >= 400 or data.error is not None:
            return error_outcome(status, body, data.error)
        if data.output is None and data.usage is None:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="response has no `output`")
        return outcome(data.usage, data.status, data.timings)

    def event_reader(self) -> ResponsesEvents:
        return ResponsesEvents()


class ResponsesEvents:
    """One streamed response: typed events until `response.completed`."""

    __slots__ = ("final", "timings", "error", "reasoning_events", "answer_events")

    def __init__(self) -> None:
        self.final: _Response | None = None
        self.timings: Timings | None = None
        self.error: ServerOutcome | None = None
        self.reasoning_events = 0
        self.answer_events = 0

    def events(self, payloads: list[bytes]) -> int:
        return sum(self._event(data) for data in payloads)

    def _event(self, data: bytes) -> bool:
        if self.final is not None or self.error is not None:
            return False  # nothing after the end counts
        try:
            event = _decode(data)
        except msgspec.DecodeError as exc:
            self.error = stream_error(f"unreadable event ({exc}): {data[:80]!r}")
            return False
        kind = event.type
        if kind == ANSWER_DELTA:
            self.answer_events += 1
            return True
        if kind in REASONING_DELTAS:
            self.reasoning_events += 1
            return True
        if event.error is not None:  # llama-server's {"error": {...}}
            self.error = stream_error(error_message(event.error, data))
        elif kind == "error":
            self.error = stream_error(event.message or error_message(None, data))
        elif kind == "response.failed":
            err = event.response.error if event.response is not None else None
            self.error = stream_error(error_message(err, data))
        elif kind in FINAL_EVENTS:
            self.final = event.response or _Response()
            self.timings = event.timings
        return False

    def finish(self) -> ServerOutcome:
        if self.error is not None:
            return self.error
        if self.final is None:
            return truncated("its `response.completed` event")
        return outcome(self.final.usage, self.final.status, self.timings, self.reasoning_events)

