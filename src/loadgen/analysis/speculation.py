"""Speculative decoding: how many drafted tokens the server accepted, from recorded `timings`.

llama-server reports per request `draft_n` (tokens drafted) and `draft_n_accepted` (of those,
accepted by the target model), and sends them only when the request drafted. Pure functions over
those sums; no I/O.

- acceptance = Σ draft_n_accepted / Σ draft_n over a level's successful requests: token-weighted,
  so a request that drafted 40 tokens counts 40 times one that drafted 1 (the mean of per-request
  rates would not be the fraction of drafted tokens that were kept).
- drafted per output token = Σ draft_n / Σ output tokens: the draft work per token the user got.
- Nothing drafted (Σ draft_n = 0, or no request carried the fields) is "no speculation", never 0%:
  0% means the server drafted and every draft was rejected.
- Unless the server said it speculates (its /slots, recorded as the target's `server.speculative`):
  a level of such a server that drafted nothing reads 0%, a drafter that never got a draft through
  (`level_acceptance_text`); what was drafted always counts, whatever the server said.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..core.records import RequestRecord

NO_SPECULATION = "no speculation"


@dataclass(frozen=True, slots=True)
class Acceptance:
    """The drafting of a set of requests: sums over the successful ones."""

    drafted: int  # Σ draft_n
    accepted: int  # Σ draft_n_accepted
    output_tokens: int  # Σ output tokens of the same requests

    @property
    def speculated(self) -> bool:
        return self.drafted > 0

    @property
    def rate(self) -> float | None:
        """Σ accepted / Σ drafted; None when nothing was drafted ("no speculation")."""
        return self.accepted / self.drafted if self.drafted > 0 else None

    @property
    def drafted_per_output_token(self) -> float | None:
        """Σ drafted / Σ output tokens; None when nothing was drafted or nothing generated."""
        return self.drafted / self.output_tokens if self.drafted > 0 and self.output_tokens > 0 else None


def acceptance(records: Iterable[RequestRecord]) -> Acceptance:
    """The token-weighted acceptance of the successful records (see the module docstring)."""
    drafted = accepted = output = 0
    for r in records:
        if not r.ok:
            continue
        drafted += r.draft_n or 0
        accepted += r.draft_n_accepted or 0
        output += r.output_tokens or 0
    return Acceptance(drafted, accepted, output)


def request_rate(r: RequestRecord) -> float | None:
    """One request's draft_n_accepted / draft_n; None when it drafted nothing."""
    if not r.draft_n:
        return None
    return (r.draft_n_accepted or 0) / r.draft_n


def acceptance_text(rate: float | None) -> str:
    """How a level's acceptance reads in tables: "82.0%", or "no speculation"."""
    return NO_SPECULATION if rate is None else f"{rate * 100:.1f}%"


def level_acceptance(speculative: bool | None, drafted: int | None, accepted: int | None) -> float | None:
    """A level's acceptance given whether its server speculates (`server.speculative`: True, False, or
    None when it did not say): Σ accepted / Σ drafted when anything was drafted; else 0.0 for a
    server that speculates (it drafted nothing at this level), None ("no speculation") otherwise."""
    if drafted:
        return (accepted or 0) / drafted
    return 0.0 if speculative else None


def level_acceptance_text(speculative: bool | None, drafted: int | None, accepted: int | None) -> str:
    """`level_acceptance` as tables show it: "82.0%", "0.0%", or "no speculation"."""
    return acceptance_text(level_acceptance(speculative, drafted, accepted))
