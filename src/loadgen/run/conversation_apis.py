"""How one turn of a conversation (`loadgen chat`, run/multiturn.py) is asked for and read, per API.

- `CompletionTurns` (--api llamacpp, the default): llama-server's `/completion`, the history as raw
  text (`turn_prompt`); the final event carries `timings`, `id_slot` and `stop_type`.
- `ChatTurns` (--api chat): `/v1/chat/completions`, the history as messages (`chat_messages`: each
  earlier message as `user`, the server's answer to it as `assistant`, then the new message), the
  salt at the start of the first message so users never share a prefix. Streamed with
  `stream_options.include_usage`; `cache_n` and `prompt_n` from llama-server's `timings` on the
  last chunks, else from `usage` (`prompt_tokens_details.cached_tokens`, and `prompt_tokens` less
  those: the computed ones, as llama-server's `prompt_n` counts them). The chunks carry no `id_slot`.

`read(data, record)` takes one SSE event's payload (after `data:`), fills the record's fields from
it, and returns the answer text it carries ("" for none).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec

from ..client.backends.common import Timings
from ..core.records import Usage

History = list[tuple[str, str]]  # (the user's message, the server's answer), turn by turn


def turn_prompt(salt: str, history: History, message: str) -> str:
    """The raw-text prompt of a turn: the salt, the earlier (message, answer) pairs, the new message."""
    past = "".join(f"User: {m}\nAssistant:{a}\n" for m, a in history)
    return f"[{salt}] {past}User: {message}\nAssistant:"


def chat_messages(salt: str, history: History, message: str) -> list[dict[str, str]]:
    """The messages of a turn: each earlier exchange as user and assistant, then the new message;
    the salt opens the first one."""
    turns = [*history, (message, None)]
    out: list[dict[str, str]] = []
    for i, (m, a) in enumerate(turns):
        out.append({"role": "user", "content": f"[{salt}] {m}" if i == 0 else m})
        if a is not None:
            out.append({"role": "assistant", "content": a})
    return out


class TurnApi(Protocol):
    path: str

    def body(self, salt: str, history: History, message: str, fields: dict[str, Any]) -> dict[str, Any]: ...

    def read(self, data: bytes, record: dict[str, Any]) -> str: ...


class _CompletionEvent(msgspec.Struct):
    content: str | None = None
    stop: bool = False
    tokens_predicted: int | None = None
    stop_type: str | None = None
    id_slot: int | None = None
    timings: Timings | None = None


def _timed(record: dict[str, Any], t: Timings) -> None:
    record.update(cache_n=t.cache_n, prompt_n=t.prompt_n, prompt_ms=t.prompt_ms, predicted_n=t.predicted_n,
                  predicted_ms=t.predicted_ms)


class CompletionTurns:
    path = "/completion"
    _decode = msgspec.json.Decoder(_CompletionEvent).decode

    def body(self, salt: str, history: History, message: str, fields: dict[str, Any]) -> dict[str, Any]:
        rest = {k: v for k, v in fields.items() if k != "max_tokens"}
        return {"prompt": turn_prompt(salt, history, message), "n_predict": fields["max_tokens"], **rest}

    def read(self, data: bytes, record: dict[str, Any]) -> str:
        event = self._decode(data)
        if event.stop:
            record.update(tokens_predicted=event.tokens_predicted, stop_type=event.stop_type, id_slot=event.id_slot)
            if event.timings is not None:
                _timed(record, event.timings)
        return event.content or ""


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _ChatChunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    timings: Timings | None = None


class ChatTurns:
    path = "/v1/chat/completions"
    _decode = msgspec.json.Decoder(_ChatChunk).decode

    def body(self, salt: str, history: History, message: str, fields: dict[str, Any]) -> dict[str, Any]:
        return {"messages": chat_messages(salt, history, message), **fields,
                "stream_options": {"include_usage": True}}

    def read(self, data: bytes, record: dict[str, Any]) -> str:
        if data.strip() == b"[DONE]":
            return ""
        chunk = self._decode(data)
        if chunk.timings is not None:
            _timed(record, chunk.timings)
        if chunk.usage is not None:
            _used(record, chunk.usage)
        choice = chunk.choices[0] if chunk.choices else None
        if choice is not None and choice.finish_reason is not None:
            record["finish_reason"] = choice.finish_reason
        return (choice.delta.content or "") if choice is not None and choice.delta is not None else ""


def _used(record: dict[str, Any], u: _Usage) -> None:
    """`usage`: the record's, and cache_n / prompt_n where no `timings` gave them."""
    record.update(usage=Usage(u.prompt_tokens, u.completion_tokens, u.total_tokens),
                  tokens_predicted=u.completion_tokens)
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details is not None else None
    if record.get("cache_n") is None and cached is not None:
        record["cache_n"] = cached
    if record.get("prompt_n") is None and u.prompt_tokens is not None:
        record["prompt_n"] = u.prompt_tokens - (cached or 0)


TURN_APIS: dict[str, TurnApi] = {"llamacpp": CompletionTurns(), "chat": ChatTurns()}
