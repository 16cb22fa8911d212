"""llama.cpp's native `POST /completion` (non-streaming)."""

from __future__ import annotations

import math
from typing import Any

import msgspec

from .. import records
from ..records import ServerOutcome
from . import GenerationParams


class _Timings(msgspec.Struct):
    """The `timings` fields loadgen records, named as llama-server emits them."""

    prompt_n: int | None = None
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_ms: float | None = None
    predicted_per_second: float | None = None
    cache_n: int | None = None


class _Completion(msgspec.Struct):
    """The part of a /completion response (or of its error body) that loadgen reads; the rest is skipped."""

    timings: _Timings | None = None
    tokens_predicted: int | None = None
    stop_type: str | None = None
    id_slot: int | None = None
    error: Any = None


_decode = msgspec.json.Decoder(_Completion).decode
_encode = msgspec.json.encode


class LlamaCppBackend:
    name = "llamacpp"
    method = "POST"
    path = "/completion"

    def __init__(self, params: GenerationParams):
        self.params = params
        fields: dict[str, Any] = {
            "n_predict": params.n_predict,
            "temperature": params.temperature,
            "ignore_eos": params.ignore_eos,
            # The prompt cache would make every request after the first report prompt_ms ~ 0.
            "cache_prompt": False,
        }
        if params.seed is not None:
            fields["seed"] = params.seed
        # Serialise everything once; per request only the salt (hex digits and dashes, which JSON
        # needs no escaping for) is put in front: {"prompt":"[<salt>] <prompt>",<fields>}.
        self._after_salt = b"] " + _encode(params.prompt)[1:] + b"," + _encode(fields)[1:]

    def build(self, salt: str) -> bytes:
        return b'{"prompt":"[' + salt.encode() + self._after_salt

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = _decode(body)
        except msgspec.DecodeError as exc:  # not JSON, or JSON of the wrong shape
            if status >= 400:
                return ServerOutcome(error_kind=f"http_{status}", error_message=_snippet(body))
            return ServerOutcome(error_kind=records.INVALID_JSON,
                                 error_message=f"unexpected response ({exc}): {_snippet(body)}")
        if status >= 400 or data.error is not None:
            err = data.error
            message = err.get("message") if isinstance(err, dict) else err
            kind = f"http_{status}" if status >= 400 else records.SERVER_ERROR
            return ServerOutcome(error_kind=kind, error_message=str(message or _snippet(body)))
        t = data.timings
        if t is None:
            return ServerOutcome(error_kind=records.INVALID_JSON, error_message="response has no `timings` object")
        pps = t.predicted_per_second
        return ServerOutcome(
            tokens_predicted=data.tokens_predicted,
            stop_type=data.stop_type,
            id_slot=data.id_slot,
            prompt_n=t.prompt_n,
            prompt_ms=t.prompt_ms,
            predicted_n=t.predicted_n,
            predicted_ms=t.predicted_ms,
            # llama-server writes inf/nan as null; guard against a server that writes them otherwise.
            predicted_per_second=pps if pps is None or math.isfinite(pps) else None,
            cache_n=t.cache_n,
        )


def _snippet(body: bytes, limit: int = 120) -> str:
    text = body[:limit].decode("utf-8", "replace").replace("\n", " ").strip()
    return text + ("…" if len(body) > limit else "") if text else "(empty body)"
