"""`loadgen tune`'s decisions between its stages: which screened cells race as finalists, and what the
search cost in server time. Pure.

The screen gives every feasible cell one short capacity search (a budget of requests, one run per
level); its answer's low end (the highest level that passed; analysis/grid_capacity.py `run_answer`)
ranks the cells. A short search under-reaches a capacity more than it over-reaches one (a level it
had no budget for is not a failure), so the rule keeps ties generously:
- a cell without an answer is dropped with its reason (infeasible: never started; failed: its server
  did not boot, died, or its search failed), never raced;
- the `k` best by low race, and every cell whose low equals the k-th best's (a tie at the cut is kept,
  not broken by grid order);
- every other cell is dropped, with the low it was screened at against the cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DROPPED, FINALIST = "dropped", "finalist"


@dataclass(frozen=True, slots=True)
class Screened:
    """A cell after the screen: its id and name, the low end of its screen answer (None: no answer),
    and why there is none (the grid run's status and reason)."""

    cell: str
    name: str
    low: float | None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Pick:
    finalists: tuple[str, ...]  # cell ids, best first
    dropped: dict[str, str]  # cell id -> why


def pick_finalists(screened: Sequence[Screened], k: int) -> Pick:
    """The cells to race (module docstring)."""
    answered = sorted((s for s in screened if s.low is not None), key=lambda s: -(s.low or 0.0))
    dropped = {s.cell: s.reason or "no answer" for s in screened if s.low is None}
    if not answered:
        return Pick((), dropped)
    cut = answered[min(k, len(answered)) - 1].low
    assert cut is not None
    keep = tuple(s.cell for s in answered if (s.low or 0.0) >= cut)
    for s in answered:
        if s.cell not in keep:
            dropped[s.cell] = f"screened at {s.low:g}, below the finalists' {cut:g}"
    return Pick(keep, dropped)


def seconds_between(started_utc: str | None, finished_utc: str | None) -> float:
    """A server's lifetime from a grid run's start and finish times (ISO 8601); 0 when either is missing
    (a cell never started)."""
    import datetime as dt

    if not started_utc or not finished_utc:
        return 0.0
    return max(0.0, (dt.datetime.fromisoformat(finished_utc) - dt.datetime.fromisoformat(started_utc)).total_seconds())
