"""What the backends share: llama-server's `timings` object and the reading of error bodies."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from ...core import records
from ...core.records import ServerOutcome

T = TypeVar("T")


class Timings(msgspec.Struct):
    """The `timings` fields loadgen records, named as llama-server emits them."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None
    # Speculative decoding: tokens drafted and of those accepted; llama-server sends them only when
    # the request drafted (a server without speculation never does).
    draft_n: int | None = None
    draft_n_accepted: int | None = None


def served_outcome(t: Timings | None, tokens_predicted: int | None = None, stop_type: str | None = None,
                   finish_reason: str | None = None, id_slot: int | None = None,
                   usage: records.Usage | None = None, reasoning_tokens: int | None = None,
                   cached_tokens: int | None = None) -> ServerOutcome:
    """The outcome of a response the server served, with its `timings` (None: it sent none).
    `cached_tokens`: the API's own count of prompt tokens read from the cache (Responses'
    `input_tokens_details.cached_tokens`, Messages' `cache_read_input_tokens`), the record's
    `cache_n` where the timings give none.

    Built positionally (in `ServerOutcome`'s field order, checked below at import): this runs once
    per request, and keywords cost several times more.
    """
    if t is None:
        return ServerOutcome(None, None, tokens_predicted, stop_type, finish_reason, id_slot, cache_n=cached_tokens,
                             usage=usage, reasoning_tokens=reasoning_tokens)
    pps = t.predicted_per_second
    if pps is not None and not math.isfinite(pps):
        pps = None  # llama-server writes inf/nan as null; guard against a server that writes them otherwise
    return ServerOutcome(None, None, tokens_predicted, stop_type, finish_reason, id_slot, t.prompt_n,
                         t.prompt_ms, t.predicted_n, t.predicted_ms, pps,
                         t.cache_n if t.cache_n is not None else cached_tokens, usage, t.draft_n,
                         t.draft_n_accepted, reasoning_tokens)


assert ServerOutcome.__struct_fields__ == (
    "error_kind", "error_message", "tokens_predicted", "stop_type", "finish_reason", "id_slot", "prompt_n",
    "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "cache_n", "usage", "draft_n",
    "draft_n_accepted", "reasoning_tokens", "output_valid", "tool_calls", "lora_applied")


def reasoning_count(reported: int | None, streamed_events: int) -> int | None:
    """Reasoning tokens: the API's own count when it gives one, else the reasoning events streamed
    (llama-server sends one token per event); None when neither shows any reasoning."""
    if reported is not None:
        return reported
    return streamed_events or None


def error_message(err: Any, body: bytes) -> str:
    """The one line a server's `{"error": ...}` says (llama-server and OpenAI both nest `message`)."""
    message = err.get("message") if isinstance(err, dict) else err
    return str(message or snippet(body))[:300]


def error_outcome(status: int, body: bytes, err: Any = None) -> ServerOutcome:
    kind = f"http_{status}" if status >= 400 else records.SERVER_ERROR
    return ServerOutcome(error_kind=kind, error_message=error_message(err, body))


def undecodable(status: int, body: bytes, exc: Exception) -> ServerOutcome:
    """A body that is not the JSON object the API promises."""
    if status >= 400:
        return ServerOutcome(error_kind=f"http_{status}", error_message=snippet(body))
    try:
        msgspec.json.decode(body)
    except msgspec.DecodeError:  # not JSON at all (an error path: the second decode costs nothing that matters)
        return ServerOutcome(error_kind=records.INVALID_JSON, error_message=f"{records.NOT_JSON_MESSAGE}: {snippet(body)}")
    return ServerOutcome(error_kind=records.INVALID_JSON, error_message=f"unexpected response ({exc}): {snippet(body)}")


def decode_event(decode: Callable[[bytes], T], data: bytes) -> tuple[T | None, ServerOutcome | None]:
    """One stream event's JSON as (chunk, None), or (None, the stream_error it is): an unreadable
    event, or one that carries an `error` object (a failure mid-stream)."""
    try:
        chunk = decode(data)
    except msgspec.DecodeError as exc:
        return None, stream_error(f"unreadable event ({exc}): {data[:80]!r}")
    err = getattr(chunk, "error", None)
    if err is not None:
        return None, stream_error(error_message(err, data))
    return chunk, None


def stream_error(message: str) -> ServerOutcome:
    return ServerOutcome(error_kind=records.STREAM_ERROR, error_message=message[:300])


def truncated(what: str) -> ServerOutcome:
    return ServerOutcome(error_kind=records.TRUNCATED_STREAM, error_message=f"the stream ended before {what}")


def snippet(body: bytes, limit: int = 120) -> str:
    text = body[:limit].decode("utf-8", "replace").replace("\n", " ").strip()
    return text + ("…" if len(body) > limit else "") if text else "(empty body)"
