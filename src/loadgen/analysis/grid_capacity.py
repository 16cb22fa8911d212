"""`loadgen grid --measure capacity`: each cell's capacity over its repeats, and which cell is best.

Pure functions over the cells' answers (`core.griddoc.CapacityEntry`, one per run that finished).

A run's answer is an interval [low, upper] of levels the capacity may be (`run_answer`):
- low = the highest level that passed (0 when none did);
- upper = low's bracket from above: the first failing level minus one (by concurrency; by rate the
  failing rate itself, as rates have no next step); the inconclusive level itself when its repeats
  disagreed (it may pass); infinite when no level failed (the search stopped at --max-concurrency
  or its budget: "at least low").
Shown as "3", "3–4" (between) or "≥8" (at least).

`loadgen grid --measure cache-capacity` ranks cells the same way by how many warm conversations
each holds (`held_answer`, `cell_held`: its runs' answers in conversations), with the same rules.
A cache-capacity run's answer is [low, upper] too:
- a collapse at K (analysis/cache.py `collapse_k`): low = the largest K measured below it, upper = K - 1
  (Ks 1, 2, 4 collapsing at 4: "2–3");
- no collapse: low = the largest K measured, upper infinite ("≥5");
- no K reused anything: none stayed warm, low 0, upper = the smallest K measured - 1.

A cell over its runs (`cell_capacity`): the mean ± sd of the lows, its floor (the lowest low) and
its ceiling (the highest upper). Failed runs give no answer; a cell with none is not ranked.

The best cell (`best_cell`), ranking the cells with an answer by mean low (grid order breaks ties):
- NONE: no cell has an answer; ALONE: one cell has;
- TIE: some other cell's ceiling reaches the leader's floor (equal means always do): the lead is
  inside the spread of the repeats, or of an answer that is only a range;
- UNTESTED: the lead clears every other cell's ceiling, but some ranked cell has a single run, so
  there is no spread between runs to test it against (`--repeat 2` or more);
- BEST: the leader's worst run is above every other cell's best, every ranked cell having
  at least two runs: its lead is outside the noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..core.griddoc import CacheCapacityEntry, CapacityEntry
from .metrics import MeanSd, mean_sd

BEST, TIE, UNTESTED, ALONE, NONE = "best", "tie", "untested", "alone", "none"


def _num(value: float) -> str:
    return f"{round(value, 2):g}"


@dataclass(frozen=True, slots=True)
class RunAnswer:
    """One run's capacity as an interval of levels (module docstring)."""

    low: float
    upper: float  # math.inf: no level failed

    @property
    def text(self) -> str:
        if math.isinf(self.upper):
            return f"≥{_num(self.low)}"
        return _num(self.low) if self.upper == self.low else f"{_num(self.low)}–{_num(self.upper)}"


def run_answer(entry: CapacityEntry) -> RunAnswer:
    low = float(entry.feasible_max or 0)
    hi = entry.bracket_hi
    if hi is None:
        return RunAnswer(low, math.inf)
    if hi in entry.inconclusive or entry.by == "rate":
        return RunAnswer(low, float(hi))
    return RunAnswer(low, max(low, float(hi) - 1))


def held_answer(entry: CacheCapacityEntry) -> RunAnswer | None:
    """How many warm conversations a cache-capacity run found the server holds (module docstring);
    None when it measured no K."""
    ks = sorted(lv.k for lv in entry.levels)
    if not ks:
        return None
    if not any(lv.warm_hit_ratio for lv in entry.levels):
        return RunAnswer(0.0, float(ks[0] - 1))
    collapse = entry.collapse_k
    if collapse is None:
        return RunAnswer(float(ks[-1]), math.inf)
    below = [k for k in ks if k < collapse]
    return RunAnswer(float(below[-1] if below else 0), float(collapse - 1))


@dataclass(frozen=True, slots=True)
class CellCapacity:
    """A cell's capacity over its runs that finished with an answer."""

    name: str
    answers: tuple[RunAnswer, ...]
    by: str = "concurrency"

    @property
    def mean(self) -> MeanSd | None:
        return mean_sd(a.low for a in self.answers)

    @property
    def floor(self) -> float:
        return min(a.low for a in self.answers)

    @property
    def ceiling(self) -> float:
        return max(a.upper for a in self.answers)

    @property
    def text(self) -> str:
        """"3" for one run; "3.5 ± 0.71 (3, 4)" over repeats; "≥4 (all 2 runs)" when every run passed the
        same highest level it tried (a mean ± 0 of lower bounds would read as a measured 4); "≥3.5 ± 0.71
        (3, ≥4)" when some did (the mean of lows is a lower bound too); "n/a" without an answer."""
        if not self.answers:
            return "n/a"
        if len(self.answers) == 1:
            return self.answers[0].text
        censored = [math.isinf(a.upper) for a in self.answers]
        if all(censored) and len({a.text for a in self.answers}) == 1:
            return f"{self.answers[0].text} (all {len(self.answers)} runs)"
        m = self.mean
        assert m is not None
        spread = f" ± {m.sd:.2g}" if m.sd else " ± 0"
        return f"{'≥' if any(censored) else ''}{_num(m.mean)}{spread} ({', '.join(a.text for a in self.answers)})"


def cell_capacity(name: str, entries: Sequence[CapacityEntry | None]) -> CellCapacity:
    """A cell's capacity from its runs' answers (None: a run without one, e.g. failed)."""
    found = [e for e in entries if e is not None]
    return CellCapacity(name, tuple(run_answer(e) for e in found), found[0].by if found else "concurrency")


HELD = "conversations"  # a CellCapacity's `by` when it counts warm conversations (--measure cache-capacity)


def cell_held(name: str, entries: Sequence[CacheCapacityEntry | None]) -> CellCapacity:
    """A cell's warm conversations from its cache-capacity runs' results (None: a run without one)."""
    return CellCapacity(name, tuple(a for e in entries if e is not None and (a := held_answer(e)) is not None), HELD)


@dataclass(frozen=True, slots=True)
class BestCell:
    """Which cell serves the most within the SLO (module docstring): `kind`, the leader, the next best,
    the cells tied with the leader (the leader first) and the sentence that says it."""

    kind: str
    best: str | None
    next_best: str | None
    tied: tuple[str, ...]
    sentence: str


def _serves(cell: CellCapacity) -> str:
    m = cell.mean
    assert m is not None
    if cell.by == HELD:
        unit = "warm conversation" if m.mean == 1 else "warm conversations"
    else:
        unit = "req/s" if cell.by == "rate" else "user" if m.mean == 1 else "users"
    return f"{_num(m.mean)} {unit}" + (" on average" if m.sd else "")


def _verb(cell: CellCapacity) -> str:
    return "holds" if cell.by == HELD else "serves"


def best_cell(cells: Sequence[CellCapacity]) -> BestCell:
    """The best cell, a tie, or why none can be named (module docstring)."""
    ranked = sorted((c for c in cells if c.answers), key=lambda c: -(c.mean.mean if c.mean else 0.0))
    if not ranked:
        return BestCell(NONE, None, None, (), "no cell has a capacity: every run failed")
    lead = ranked[0]
    if len(ranked) == 1:
        return BestCell(ALONE, lead.name, None, (lead.name,),
                        f"only {lead.name} has a capacity: it {_verb(lead)} {_serves(lead)}")
    rivals, runner = ranked[1:], ranked[1]
    tied = [c for c in rivals if c.ceiling >= lead.floor]
    if tied:
        names = (lead.name, *(c.name for c in tied))
        listed = ", ".join(f"{c.name} ({c.text})" for c in (lead, *tied))
        return BestCell(TIE, None, None, names,
                        f"tie: {listed}; no lead outside the spread of the repeats")
    head = f"{lead.name} {_verb(lead)} {_serves(lead)}, the next best ({runner.name}) {_serves(runner)}"
    single = [c for c in ranked if len(c.answers) < 2]
    if single:
        why = "one run per cell" if len(single) == len(ranked) else f"{single[0].name} has one run"
        return BestCell(UNTESTED, lead.name, runner.name, (),
                        f"{head}; untested: {why}, so no spread to test the lead against; use --repeat 2 or more")
    return BestCell(BEST, lead.name, runner.name, (), f"{head}; lead outside the noise")
