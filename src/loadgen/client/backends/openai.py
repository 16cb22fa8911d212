"""The OpenAI-compatible APIs: `POST /v1/completions` and `POST /v1/chat/completions`.

Spoken by llama-server, vLLM, SGLang and Ollama alike. Token counts come from `usage` (asked for in
streams with `stream_options.include_usage`); llama-server also sends its `timings`, other servers
do not, and everything derived from them is then simply absent. A stream ends with `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core import records
from ...core.records import ServerOutcome, Usage
from . import GenerationParams, SaltedBodies, generation_fields
from .common import Timings, decode_event, error_outcome, reasoning_count, served_outcome, truncated, undecodable
from .conversation import History, chat_messages, turn_prompt
from .features import answer_check, checked_parse, checked_reader, feature_fields


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None  # reasoning models stream their thinking here


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    """`usage` with the details loadgen reads; recorded as `records.Usage`."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    completion_tokens_details: _CompletionDetails | None = None
    prompt_tokens_details: _PromptDetails | None = None


def _usage(u: _Usage | None) -> Usage | None:
    return None if u is None else Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens)


def _served(t: Timings | None, u: _Usage | None, finish_reason: str | None,
            reasoning_tokens: int | None) -> ServerOutcome:
    """The outcome of a served response. Without llama-server's `timings`, the usage's
    `prompt_tokens_details.cached_tokens` (when given) is `cache_n`, and the prompt tokens less those
    are `prompt_n` (the computed ones, as llama-server counts them)."""
    cached = u.prompt_tokens_details.cached_tokens if u is not None and u.prompt_tokens_details is not None else None
    if t is None and cached is not None and u is not None and u.prompt_tokens is not None:
        t = Timings(prompt_n=u.prompt_tokens - cached, cache_n=cached)
    return served_outcome(t, finish_reason=finish_reason, usage=_usage(u), reasoning_tokens=reasoning_tokens)


def _reported_reasoning(u: _Usage | None) -> int | None:
    details = u.completion_tokens_details if u is not None else None
    return details.reasoning_tokens if details is not None else None


class _Message(msgspec.Struct):
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None  # /v1/completions
    delta: _Delta | None = None  # /v1/chat/completions, streamed
    message: _Message | None = None  # /v1/chat/completions, whole
    finish_reason: str | None = None


class _Response(msgspec.Struct):
    """A whole response, one stream chunk or an error body: the fields loadgen reads."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    timings: Timings | None = None
    error: Any = None


_decode = msgspec.json.Decoder(_Response).decode
DONE = b"[DONE]"


class OpenAIBackend:
    method = "POST"

    def __init__(self, params: GenerationParams, *, chat: bool, model: str | None):
        self.params = params
        self.stream = params.stream
        self.name = "chat" if chat else "completions"
        self.path = "/v1/chat/completions" if chat else "/v1/completions"
        self.model = model
        # ignore_eos and cache_prompt are not OpenAI's, but llama-server, vLLM and SGLang read them.
        fields = self._fields = generation_fields(params, "max_tokens", **({"model": model} if model is not None else {}))
        if chat and params.reasoning_effort is not None:
            fields["reasoning_effort"] = params.reasoning_effort
        fields.update(feature_fields(params, self.name))
        if params.stream:
            fields["stream_options"] = {"include_usage": True}
        if chat:
            head, close = b'{"messages":[{"role":"user","content":', b"}]"
        else:
            head, close = b'{"prompt":', b""
        self._chat = chat
        self._bodies = SaltedBodies(head, params.prompt_list, close, fields, params.n_predicts, "max_tokens",
                                    params.prefixes)
        self.build = self._bodies.build
        check = answer_check(params)
        if check is not None:  # judged answers; a plain run keeps the methods below as they are
            tools = bool(params.tools)
            self.parse = checked_parse(self.parse, check, tools)  # type: ignore[method-assign]  # checked answers only
            self.event_reader = lambda: checked_reader(_StreamEvents, check, tools)  # type: ignore[method-assign]  # checked answers only

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:
            return undecodable(status, body, exc)
        if status >= 400 or data.error is not None:
            return error_outcome(status, body, data.error)
        if not data.choices:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="response has no `choices`")
        choice = data.choices[0]
        thought = choice.message is not None and bool(choice.message.reasoning_content)
        reported = _reported_reasoning(data.usage)
        return _served(data.timings, data.usage, choice.finish_reason,
                       # a whole answer's thinking is one text: its tokens are known only if reported
                       reported if reported is not None or not thought else None)

    def event_reader(self) -> _StreamEvents:
        return _StreamEvents()

    def build_turn(self, salt: str, history: History, message: str, id_slot: int | None = None) -> bytes:
        """A conversation's turn: its history as messages (chat) or raw text, then the fields `build` sends."""
        prompt = ({"messages": chat_messages(salt, history, message)} if self._chat
                  else {"prompt": turn_prompt(salt, history, message)})
        return msgspec.json.encode({**prompt, **self._fields, **({"id_slot": id_slot} if id_slot is not None else {})})

    def answer_reader(self) -> _StreamEvents:
        return _StreamEvents(keep_text=True)


class _StreamEvents:
    """One streamed response: chunks until `[DONE]`; `usage` and `timings` ride on the last ones.
    Chat deltas with `reasoning_content` are thinking, with `content` the answer."""

    __slots__ = ("done", "error", "usage", "timings", "finish_reason", "answer_events", "reasoning_events", "_text",
                 "chunks")

    def __init__(self, keep_text: bool = False) -> None:
        self._text: list[str] | None = [] if keep_text else None  # the answer's pieces, kept
        self.done = False
        self.error: ServerOutcome | None = None
        self.answer_events = 0
        self.reasoning_events = 0
        self.usage: _Usage | None = None
        self.timings: Timings | None = None
        self.finish_reason: str | None = None
        self.chunks = 0  # chunks decoded before [DONE]: none is no answer at all

    def events(self, payloads: list[bytes]) -> int:
        return sum(self._event(data) for data in payloads)

    def _event(self, data: bytes) -> bool:
        if self.done or self.error is not None:
            return False
        if data == DONE:
            self.done = True
            return False
        chunk, self.error = decode_event(_decode, data)
        if chunk is None:
            return False
        self.chunks += 1
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.timings is not None:
            self.timings = chunk.timings
        if not chunk.choices:
            return False
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            self.finish_reason = choice.finish_reason
        if choice.text:
            self.answer_events += 1
            if self._text is not None:
                self._text.append(choice.text)
            return True
        delta = choice.delta
        if delta is None:
            return False
        if delta.content:  # a chunk with both is an answer chunk: the answer has begun
            self.answer_events += 1
            if self._text is not None:
                self._text.append(delta.content)
            return True
        if delta.reasoning_content:
            self.reasoning_events += 1
            return True
        return False

    @property
    def answer(self) -> str:
        return "".join(self._text or ())

    def finish(self) -> ServerOutcome:
        if self.error is not None:
            return self.error
        if not self.done:
            return truncated("its `data: [DONE]` line")
        if not self.chunks:  # `data: [DONE]` alone: the server sent no answer, not an empty one
            return truncated("any chunk: it held only `data: [DONE]`")
        return _served(self.timings, self.usage, self.finish_reason,
                       reasoning_count(_reported_reasoning(self.usage), self.reasoning_events))
