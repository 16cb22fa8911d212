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

Successive halving (`next_round`): when more than `k` race on because a short search stopped below
their capacity ("≥4" for three cells: a tie the budget made), or a cell below the cut is censored
(its search ran out of budget below the cut: it may pass it), those cells and the finalists are
screened again with twice the budget, up to `--screen-rounds` rounds; a tie of answers that are not censored is real, and
a longer search would only confirm it, so it goes to the final as it is.

The final (`final_entrants`): the finalists the screen already separates are not searched again. A
finalist whose screen bracket lies wholly below the leader's proven low by more than the noise
(`upper × (1 + noise) < leader's low`, capacity's `--noise`, 10%: a lead the capacity search itself
would not call noise) is dropped; a censored answer ("≥4") has no upper bound and always races. A
lone finalist gets one full search (`final_runs`), not `--final-repeat`. Each
search after the first round starts at the cell's screen answer (`start_level`: capacity `--start`),
so it checks around it instead of climbing from 1 again.

The bar (`screen_bar`): the screen's first round runs its cells one at a time, in the grid's order.
Once `k` cells have a proven low, the k-th best of them is the finalists' cut as it stands (the cut
only rises as cells are added), and a later cell matters only if it reaches it. So its search starts
at the bar, the cut less the noise (`cut / (1 + noise)`, capacity's `--noise`: a cell that fails the
cut by what run-to-run noise moves is not dropped for it), with capacity `--at-least`: a bar that
does not pass ends the search (its capacity is below the cut; how far below does not matter) and
the cell is dropped; a bar that passes climbs from there as from any start.
"""

from __future__ import annotations

import math
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
    censored: bool = False  # its search passed every level it had the budget for: the capacity may be higher
    upper: float = math.inf  # the highest capacity its answer allows (analysis/grid_capacity.py RunAnswer)
    barred: float | None = None  # the screen's bar it was checked at and did not pass (screen_bar)


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
            dropped[s.cell] = (f"below the screen's bar: {s.barred:g} did not pass (the finalists' cut so far less "
                               "the noise), not searched further" if s.barred is not None
                               else f"screened at {s.low:g}, below the finalists' {cut:g}")
    return Pick(keep, dropped)


def final_entrants(screened: Sequence[Screened], k: int, noise: float) -> Pick:
    """The cells whose full capacity search the final runs: `pick_finalists`' cells less those the
    screen already puts below the leader beyond the noise (module docstring)."""
    pick = pick_finalists(screened, k)
    if not pick.finalists:
        return pick
    by_id = {s.cell: s for s in screened}
    top = max(by_id[c].low or 0.0 for c in pick.finalists)
    below = [c for c in pick.finalists if by_id[c].upper * (1 + noise) < top]
    dropped = dict(pick.dropped)
    for c in below:
        dropped[c] = (f"screened at {by_id[c].upper:g} at most, below the leader's {top:g} beyond the "
                      f"{noise:.0%} noise: not searched again")
    return Pick(tuple(c for c in pick.finalists if c not in below), dropped)


def final_runs(entrants: int, final_repeat: int) -> int:
    """Full capacity searches per finalist in the final: `--final-repeat`, whose repeats tell a lead from
    the noise between finalists; one for a lone finalist, whose lead the screen already settled beyond
    the noise (`final_entrants`) and which has nothing to be told apart from."""
    return final_repeat if entrants > 1 else min(1, final_repeat)


def start_level(low: float | None, by_rate: bool) -> float | None:
    """Where a cell's next capacity search starts (`--start`): at its screen answer's low end, the
    highest level that passed; None (from the search's own start) when nothing passed."""
    if low is None or low <= 0 or (not by_rate and low < 1):
        return None
    return float(math.floor(low)) if not by_rate else low


def screen_bar(lows: Sequence[float | None], k: int, noise: float, by_rate: bool) -> float | None:
    """The level a cell screened next must reach to matter (module docstring, "The bar"): the k-th best
    proven low so far (the finalists' cut as it stands) less the noise, `cut / (1 + noise)`, whole users
    down (None below 2: a bar at 1 is the search's own start), a rate to three significant digits down;
    None while fewer than k cells have a proven low."""
    proven = sorted((low for low in lows if low is not None and low > 0), reverse=True)
    if len(proven) < k:
        return None
    bar = proven[k - 1] / (1 + noise)
    if not by_rate:
        whole = math.floor(bar + 1e-9)
        return float(whole) if whole >= 2 else None
    step = 10.0 ** (math.floor(math.log10(bar)) - 2)
    return float(f"{math.floor(bar / step + 1e-9) * step:.3g}")


def next_round(screened: Sequence[Screened], k: int) -> tuple[str, ...]:
    """The cells a screen round sends to one more round with twice the budget (successive halving): the
    finalists of this round (`pick_finalists`: the k best and the ties at the cut) and every censored
    cell below the cut (its short search stopped below its capacity, which may pass the cut: a search
    that started at a higher bar runs out of budget sooner), when there is such a cell or the finalists
    are more than k with a censored one tied at the cut; () when the round decided: no censored cell
    below the cut, and k or fewer finalists or a tie at the cut of answers that are not censored (a
    longer search would only confirm it: they race in the final)."""
    pick = pick_finalists(screened, k)
    if not pick.finalists:
        return ()
    lows = {s.cell: s.low or 0.0 for s in screened if s.low is not None}
    cut = min(lows[c] for c in pick.finalists)
    below = tuple(s.cell for s in screened if s.censored and s.low is not None and s.low < cut)
    tied = len(pick.finalists) > k and any(s.censored and s.low == cut for s in screened if s.cell in pick.finalists)
    return (*pick.finalists, *below) if below or tied else ()


def seconds_between(started_utc: str | None, finished_utc: str | None) -> float:
    """A server's lifetime from a grid run's start and finish times (ISO 8601); 0 when either is missing
    (a cell never started)."""
    import datetime as dt

    if not started_utc or not finished_utc:
        return 0.0
    return max(0.0, (dt.datetime.fromisoformat(finished_utc) - dt.datetime.fromisoformat(started_utc)).total_seconds())
