"""llama.cpp's native `POST /completion` (non-streaming)."""

from __future__ import annotations

import json
import math
from typing import Any

from .. import records
from ..records import ServerOutcome
from . import GenerationParams


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
        # Serialise the fixed part once; per request only the salted prompt is encoded.
        self._tail = json.dumps(fields, separators=(",", ":"))[1:].encode()
        self._prompt = params.prompt

    def build(self, salt: str) -> bytes:
        prompt = json.dumps(f"[{salt}] {self._prompt}", ensure_ascii=False)
        return b'{"prompt":' + prompt.encode() + b"," + self._tail

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            if status >= 400:
                return ServerOutcome(error_kind=f"http_{status}", error_message=_snippet(body))
            return ServerOutcome(error_kind=records.INVALID_JSON,
                                 error_message=f"response is not JSON: {_snippet(body)}")
        if not isinstance(data, dict):
            return ServerOutcome(error_kind=records.INVALID_JSON,
                                 error_message="response JSON is not an object")
        if status >= 400 or "error" in data:
            err = data.get("error")
            message = err.get("message") if isinstance(err, dict) else err
            kind = f"http_{status}" if status >= 400 else records.SERVER_ERROR
            return ServerOutcome(error_kind=kind, error_message=str(message or _snippet(body)))
        timings = data.get("timings")
        if not isinstance(timings, dict):
            return ServerOutcome(error_kind=records.INVALID_JSON,
                                 error_message="response has no `timings` object")
        return ServerOutcome(
            tokens_predicted=_int(data.get("tokens_predicted")),
            stop_type=data.get("stop_type") if isinstance(data.get("stop_type"), str) else None,
            id_slot=_int(data.get("id_slot")),
            prompt_n=_int(timings.get("prompt_n")),
            prompt_ms=_float(timings.get("prompt_ms")),
            predicted_n=_int(timings.get("predicted_n")),
            predicted_ms=_float(timings.get("predicted_ms")),
            predicted_per_second=_float(timings.get("predicted_per_second")),
            cache_n=_int(timings.get("cache_n")),
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    # llama-server writes inf/nan as null (predicted_per_second with a single token, for one).
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _snippet(body: bytes, limit: int = 120) -> str:
    text = body[:limit].decode("utf-8", "replace").replace("\n", " ").strip()
    return text + ("…" if len(body) > limit else "") if text else "(empty body)"
