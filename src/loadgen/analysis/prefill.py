"""Prefill: how fast each server reads a prompt of N tokens (the field report's long-prompt test).

Per server and length N, `--repeat` requests one after another, each "[<salt>] " + a body cut to
exactly N tokens for that server (see `exact_prompt`), `cache_prompt: false`, `n_predict: 1`:
- prompt_n       the server's count of prompt tokens it computed (should be N)
- prompt_ms      the server's time from slot start to the first token (queue wait excluded)
- prompt tok/s   prompt_n / prompt_ms × 1000 per request (`metrics.prompt_tok_s`)
- TTFT (client)  the request's wall time: with one token to generate, the response ends at the
                 first token, so this is the time to first token as a client sees it (prefill +
                 one sampling step + tokenization + HTTP)
Each figure is mean ± sd over the repeats, like llama-bench's `-r`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..core import records
from ..core.records import RequestRecord
from .metrics import MeanSd, latency_ms, mean_sd, prompt_tok_s


def client_ttft_ms(r: RequestRecord) -> float | None:
    """Wall time of a one-token request: its time to first token as the client saw it."""
    return latency_ms(r) if r.ok else None


@dataclass(frozen=True, slots=True)
class PrefillRow:
    prompt_tokens: int  # asked for
    requests_ok: int = 0
    requests_failed: int = 0
    errors_by_kind: dict[str, int] | None = None
    prompt_n: MeanSd | None = None
    prompt_n_min: int | None = None
    prompt_n_max: int | None = None
    prompt_ms: MeanSd | None = None
    prompt_tok_s: MeanSd | None = None
    ttft_ms: MeanSd | None = None
    note: str | None = None  # how the prompt was built, when it is not exact
    skipped: str | None = None  # why no request was sent at this length

    def to_dict(self) -> dict:
        def d(s: MeanSd | None) -> dict | None:
            return s.to_dict() if s else None

        return {"prompt_tokens": self.prompt_tokens, "requests_ok": self.requests_ok,
                "requests_failed": self.requests_failed, "errors_by_kind": dict(self.errors_by_kind or {}),
                "prompt_n": d(self.prompt_n), "prompt_n_min": self.prompt_n_min, "prompt_n_max": self.prompt_n_max,
                "prompt_ms": d(self.prompt_ms), "prompt_tok_s": d(self.prompt_tok_s), "ttft_ms": d(self.ttft_ms),
                "note": self.note, "skipped": self.skipped}


def summarize_prefill(prompt_tokens: int, rs: Sequence[RequestRecord], note: str | None = None) -> PrefillRow:
    """One row: the requests at one prompt length on one target."""
    rs = [r for r in rs if r.error_kind not in records.CLIENT_SIDE]
    ok = [r for r in rs if r.ok]
    counts = [r.prompt_n for r in ok if r.prompt_n is not None]
    return PrefillRow(
        prompt_tokens=prompt_tokens, requests_ok=len(ok), requests_failed=len(rs) - len(ok),
        errors_by_kind=dict(sorted(Counter(r.error_kind for r in rs if r.error_kind is not None).items())),
        prompt_n=mean_sd(counts), prompt_n_min=min(counts, default=None), prompt_n_max=max(counts, default=None),
        prompt_ms=mean_sd(r.prompt_ms for r in ok), prompt_tok_s=mean_sd(prompt_tok_s(r) for r in ok),
        ttft_ms=mean_sd(client_ttft_ms(r) for r in ok), note=note)
