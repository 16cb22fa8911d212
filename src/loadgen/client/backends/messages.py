"""Anthropic's Messages API, `POST /v1/messages`, whole or streamed.

Request: `{"model", "max_tokens", "messages": [{"role": "user", "content": "[salt] prompt"}], ...}`.
Caveat: llama-server build 11434 ignores `cache_prompt: false` on this endpoint (the same request
twice read 38 of 39 prompt tokens from the cache); loadgen still sends it, and the salt at the
start of the user's text leaves only the chat template's prefix for the cache to reuse.

Stream: named events. `message_start` (`message.usage`: input and cache-read tokens),
`content_block_delta` whose `delta.type` is `text_delta` (answer) or `thinking_delta` (reasoning),
`message_delta` (`delta.stop_reason`, `usage.output_tokens`), then `message_stop`, the end. No
`[DONE]`. Failures come as `{"type": "error", "error": {"message"}}` (Anthropic's) or
llama-server's `{"error": {...}}`: both carry an `error` object.

Tokens: Anthropic's `input_tokens` leaves out the tokens read from the cache, so the record's
prompt tokens are `input_tokens + cache_read_input_tokens` and `cache_n` is the cache-read count.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core import records
from ...core.records import ServerOutcome
from . import GenerationParams, SaltedBodies, generation_fields
from .common import Timings, decode_event, error_outcome, reasoning_count, served_outcome, truncated, undecodable

ANSWER_DELTA = "text_delta"
REASONING_DELTA = "thinking_delta"


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _Delta(msgspec.Struct):
    type: str | None = None
    stop_reason: str | None = None


class _Message(msgspec.Struct):
    usage: _Usage | None = None
    stop_reason: str | None = None


class _Event(msgspec.Struct):
    """One stream event, or a whole body (a message, or an error): the fields loadgen reads."""

    type: str | None = None
    delta: _Delta | None = None
    usage: _Usage | None = None
    message: _Message | None = None
    stop_reason: str | None = None
    content: list[Any] | None = None
    timings: Timings | None = None
    error: Any = None


_decode = msgspec.json.Decoder(_Event).decode


def outcome(start: _Usage | None, end: _Usage | None, stop_reason: str | None,
            timings: Timings | None, reasoning_events: int = 0) -> ServerOutcome:
    """A served message's outcome. `start` is the usage known when the message began (input and
    cache reads), `end` the final one (output tokens); a whole body has both in one."""
    def pick(name: str) -> int | None:
        for u in (end, start):
            value = getattr(u, name) if u is not None else None
            if value is not None:
                return value
        return None

    fresh, cached, output = pick("input_tokens"), pick("cache_read_input_tokens"), pick("output_tokens")
    prompt = None if fresh is None else fresh + (cached or 0)
    total = None if prompt is None or output is None else prompt + output
    usage = records.Usage(prompt, output, total) if (prompt, output) != (None, None) else None
    # Anthropic's usage has no reasoning count: thinking tokens are the thinking deltas counted.
    return served_outcome(timings, finish_reason=stop_reason, usage=usage,
                          reasoning_tokens=reasoning_count(None, reasoning_events), cached_tokens=cached)


class MessagesBackend:
    name = "messages"
    method = "POST"
    path = "/v1/messages"

    def __init__(self, params: GenerationParams, model: str | None):
        self.params = params
        self.stream = params.stream
        self.model = model
        # Anthropic requires `model`; llama-server ignores its value.
        fields = generation_fields(params, "max_tokens", model=model or "default")
        self._bodies = SaltedBodies(b'{"messages":[{"role":"user","content":', params.prompt_list, b"}]", fields)
        self.build = self._bodies.build

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:
            return undecodable(status, body, exc)
        if status >= 400 or data.error is not None:
            return error_outcome(status, body, data.error)
        if data.content is None:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="response has no `content`")
        return outcome(None, data.usage, data.stop_reason, data.timings)

    def event_reader(self) -> MessagesEvents:
        return MessagesEvents()


class MessagesEvents:
    """One streamed message: typed events until `message_stop`."""

    __slots__ = ("done", "error", "start_usage", "end_usage", "stop_reason", "timings", "reasoning_events",
                 "answer_events")

    def __init__(self) -> None:
        self.done = False
        self.error: ServerOutcome | None = None
        self.start_usage: _Usage | None = None
        self.end_usage: _Usage | None = None
        self.stop_reason: str | None = None
        self.timings: Timings | None = None
        self.reasoning_events = 0
        self.answer_events = 0

    def events(self, payloads: list[bytes]) -> int:
        return sum(self._event(data) for data in payloads)

    def _event(self, data: bytes) -> bool:
        if self.done or self.error is not None:
            return False  # nothing after the end counts
        event, self.error = decode_event(_decode, data)
        if event is None:
            return False
        kind = event.type
        if kind == "content_block_delta" and event.delta is not None:
            if event.delta.type == ANSWER_DELTA:
                self.answer_events += 1
                return True
            if event.delta.type == REASONING_DELTA:
                self.reasoning_events += 1
                return True
            return False
        if kind == "message_start" and event.message is not None:
            self.start_usage = event.message.usage
        elif kind == "message_delta":
            if event.usage is not None:
                self.end_usage = event.usage
            if event.delta is not None and event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
        elif kind == "message_stop":
            self.done = True
        if event.timings is not None:  # not sent by build 11434; read if a server adds them
            self.timings = event.timings
        return False

    def finish(self) -> ServerOutcome:
        if self.error is not None:
            return self.error
        if not self.done:
            return truncated("its `message_stop` event")
        return outcome(self.start_usage, self.end_usage, self.stop_reason, self.timings, self.reasoning_events)
