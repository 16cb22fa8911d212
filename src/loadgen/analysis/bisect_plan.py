"""`loadgen bisect`'s next step: which commit to measure, or what the measured ones say (pure).

The commits are in order from the good end (index 0) to the bad end (the last), each with its
verdict so far: None (not measured), GOOD or BAD (the gate against the good end's runs), SKIP (it did
not build, or its server never served: git bisect's skip) or UNDECIDED (the gate could not tell it
from the good end within the noise, even after more runs). As git bisect, the search assumes one
change of state: the first BAD commit bounds it from above (`high`) and the last GOOD one below it
from below (`low`); a GOOD above `high` (a regression that came and went) is outside the search.

- a commit between them not yet measured: measure the one nearest the middle (the lower of two
  equally near), so each measurement halves the range;
- none left, and none skipped between them: `high` is the first bad commit (FOUND);
- none left, but some skipped: the first bad commit is one of the skipped ones or `high` (RANGE),
  as git bisect says "only skipped commits left to test";
- one between them UNDECIDED: the noise left the boundary undecided there, and the search stops
  with the range (UNDECIDED); the caller has already measured it again before calling it so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GOOD, BAD, SKIP, UNDECIDED = "good", "bad", "skip", "undecided"
VERDICTS = (GOOD, BAD, SKIP, UNDECIDED)
MEASURE, FOUND, RANGE = "measure", "found", "range"  # and UNDECIDED: a step's status


@dataclass(frozen=True, slots=True)
class BisectStep:
    status: str  # MEASURE (`index` next), FOUND, RANGE or UNDECIDED
    low: int  # the last good commit below the first bad one
    high: int  # the first bad commit measured
    index: int | None = None  # MEASURE: the commit to measure next
    candidates: tuple[int, ...] = ()  # FOUND: (high,); RANGE and UNDECIDED: the commits the first bad one may be


def next_step(verdicts: Sequence[str | None]) -> BisectStep:
    """The next step over the commits' verdicts (index 0 the good end, the last the bad end; both
    must be judged so, else ValueError)."""
    if len(verdicts) < 2 or verdicts[0] != GOOD or verdicts[-1] != BAD:
        raise ValueError("bisect needs the good end judged good and the bad end judged bad")
    unknown = [v for v in verdicts if v is not None and v not in VERDICTS]
    if unknown:
        raise ValueError(f"unknown verdict {unknown[0]!r}")
    high = verdicts.index(BAD)
    low = max(i for i in range(high) if verdicts[i] == GOOD)
    between = range(low + 1, high)
    undecided = [i for i in between if verdicts[i] == UNDECIDED]
    if undecided:
        return BisectStep(UNDECIDED, low, high, candidates=tuple(range(low + 1, high + 1)))
    open_ = [i for i in between if verdicts[i] is None]
    if open_:
        middle = (low + high) / 2
        return BisectStep(MEASURE, low, high, index=min(open_, key=lambda i: (abs(i - middle), i)))
    skipped = tuple(i for i in between if verdicts[i] == SKIP)
    if skipped:
        return BisectStep(RANGE, low, high, candidates=(*skipped, high))
    return BisectStep(FOUND, low, high, candidates=(high,))
