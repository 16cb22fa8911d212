"""Depth: decode speed after the context is already filled to D tokens (llama-bench's `-d`).

Per server and depth D, `--repeat` requests one after another with a prompt of exactly D tokens
(see `exact_prompt`; depth 0 is the shortest prompt there is, the salt alone), `cache_prompt:
false` and `--n-predict` tokens with `ignore_eos`:
- decode tok/s   the server's `timings.predicted_per_second`: tokens after the first / predicted_ms,
                 so the prompt's own cost is not in it; mean ± sd over the repeats
- change         decode tok/s at D / decode tok/s at depth 0 − 1 (the lowest measured depth when 0
                 was not asked for): the slowdown a filled context causes
A depth whose prompt plus `n_predict` does not fit the server's per-slot context (`/props`
`default_generation_settings.n_ctx`) is not sent: its row says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..core import records
from ..core.records import RequestRecord
from .context import context_overflow
from .metrics import MeanSd, decode_tok_s, mean_sd


def skip_reason(prompt_tokens: int, n_predict: int, n_ctx: int | None) -> str | None:
    """Why a prompt of this many tokens cannot run on a server with this per-slot context, or None."""
    problem = context_overflow(prompt_tokens, n_predict, n_ctx)
    return None if problem is None else f"skipped: {problem}"


SKIP_HINT = "to measure a skipped size, restart the server with a larger -c or fewer --parallel slots"


@dataclass(frozen=True, slots=True)
class DepthRow:
    depth: int  # asked for
    requests_ok: int = 0
    requests_failed: int = 0
    errors_by_kind: dict[str, int] | None = None
    prompt_n: MeanSd | None = None
    predicted_n: MeanSd | None = None
    decode_tok_s: MeanSd | None = None
    change: float | None = None  # vs the reference depth
    reference_depth: int | None = None
    note: str | None = None
    skipped: str | None = None

    def to_dict(self) -> dict:
        def d(s: MeanSd | None) -> dict | None:
            return s.to_dict() if s else None

        return {"depth": self.depth, "requests_ok": self.requests_ok, "requests_failed": self.requests_failed,
                "errors_by_kind": dict(self.errors_by_kind or {}), "prompt_n": d(self.prompt_n),
                "predicted_n": d(self.predicted_n), "decode_tok_s": d(self.decode_tok_s), "change": self.change,
                "reference_depth": self.reference_depth, "note": self.note, "skipped": self.skipped}


def summarize_depth(depth: int, rs: Sequence[RequestRecord], note: str | None = None) -> DepthRow:
    rs = [r for r in rs if r.error_kind not in records.CLIENT_SIDE]
    ok = [r for r in rs if r.ok]
    return DepthRow(
        depth=depth, requests_ok=len(ok), requests_failed=len(rs) - len(ok),
        errors_by_kind=dict(sorted(Counter(r.error_kind for r in rs if r.error_kind is not None).items())),
        prompt_n=mean_sd(r.prompt_n for r in ok), predicted_n=mean_sd(r.predicted_n for r in ok),
        decode_tok_s=mean_sd(decode_tok_s(r) for r in ok), note=note)


def with_change(rows: Sequence[DepthRow]) -> list[DepthRow]:
    """Fill each row's change relative to depth 0, or to the lowest depth that was measured."""
    measured = [r for r in rows if r.decode_tok_s is not None and r.skipped is None]
    if not measured:
        return list(rows)
    ref = min(measured, key=lambda r: r.depth)
    base = ref.decode_tok_s.mean if ref.decode_tok_s else 0
    return [replace(r, reference_depth=ref.depth,
                    change=(r.decode_tok_s.mean / base - 1) if r.decode_tok_s and base > 0 else None)
            for r in rows]
