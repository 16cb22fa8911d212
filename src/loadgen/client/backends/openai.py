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
from . import GenerationParams, SaltedBodies
from .common import Timings, decode_event, error_outcome, served_outcome, truncated, undecodable


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None  # reasoning models stream their thinking here


class _Choice(msgspec.Struct):
    text: str | None = None  # /v1/completions
    delta: _Delta | None = None  # /v1/chat/completions, streamed
    finish_reason: str | None = None


class _Response(msgspec.Struct):
    """A whole response, one stream chunk or an error body: the fields loadgen reads."""

    choices: list[_Choice] | None = None
    usage: Usage | None = None
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
        fields: dict[str, Any] = {}
        if model is not None:
            fields["model"] = model
        fields.update({
            "max_tokens": params.n_predict,
            "temperature": params.temperature,
            # Not OpenAI's, but llama-server, vLLM and SGLang read them; other servers ignore them.
            "ignore_eos": params.ignore_eos,
            "cache_prompt": params.cache_prompt,
        })
        if params.seed is not None:
            fields["seed"] = params.seed
        if params.stream:
            fields["stream"] = True
            fields["stream_options"] = {"include_usage": True}
        if chat:
            head, close = b'{"messages":[{"role":"user","content":', b"}]"
        else:
            head, close = b'{"prompt":', b""
        self._bodies = SaltedBodies(head, params.prompt_list, close, fields, params.n_predicts, "max_tokens",
                                    params.prefixes)
        self.build = self._bodies.build

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:
            return undecodable(status, body, exc)
        if status >= 400 or data.error is not None:
            return error_outcome(status, body, data.error)
        if not data.choices:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="response has no `choices`")
        return served_outcome(data.timings, finish_reason=data.choices[0].finish_reason, usage=data.usage)

    def event_reader(self) -> "_StreamEvents":
        return _StreamEvents()


class _StreamEvents:
    """One streamed response: chunks until `[DONE]`; `usage` and `timings` ride on the last ones."""

    __slots__ = ("done", "error", "usage", "timings", "finish_reason")

    def __init__(self) -> None:
        self.done = False
        self.error: ServerOutcome | None = None
        self.usage: Usage | None = None
        self.timings: Timings | None = None
        self.finish_reason: str | None = None

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
            return True
        delta = choice.delta
        return delta is not None and bool(delta.content or delta.reasoning_content)

    def finish(self) -> ServerOutcome:
        if self.error is not None:
            return self.error
        if not self.done:
            return truncated("its `data: [DONE]` line")
        return served_outcome(self.timings, finish_reason=self.finish_reason, usage=self.usage)
