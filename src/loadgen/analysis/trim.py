"""--trim: a level's warm-up and cool-down left out of its figures, its records kept.

A level's window runs from its first request's start (the intended send) to its last completion,
the span its wall time measures (requests cancelled at Ctrl-C or lost with a worker left out, as
there). `--trim 10%` cuts a tenth of that span at each end, `--trim 5s` five seconds: a record
whose start falls before `first + cut` (warm-up: the level's requests not yet all in flight) or
after `last - cut` (cool-down: its last requests finishing alone) is left out of the level's
figures, its throughput and SLO judgement included; the figures are those of the records started
inside [first + cut, last - cut]. A level too short to keep any record that way is not trimmed, and
says so. The records themselves stay in requests.jsonl and the histograms files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core import records
from ..core.records import RequestRecord


@dataclass(frozen=True, slots=True)
class Trim:
    """How much of each end of a level's window to leave out: a share of it, or seconds."""

    share: float | None = None  # of the window, at each end (0 < share < 0.5)
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.share is None) == (self.seconds is None):
            raise ValueError("a trim is a share of the window or a number of seconds, one of them")

    @property
    def text(self) -> str:
        """As the user wrote it: "10%" or "5s" (run.json's config "trim")."""
        return f"{self.share * 100:g}%" if self.share is not None else f"{self.seconds:g}s"

    def cut_s(self, window_s: float) -> float:
        """The seconds cut at each end of a window this long."""
        if self.share is not None:
            return self.share * window_s
        assert self.seconds is not None  # __post_init__: exactly one of the two is set
        return self.seconds


@dataclass(frozen=True, slots=True)
class Trimmed:
    """A level's records split by `trim_level`: those its figures count, and how many were left out."""

    kept: list[RequestRecord]
    head: int  # started in the first `cut_s` of the window
    tail: int  # started in the last `cut_s`
    cut_s: float
    too_short: bool = False  # the cut would leave no record: nothing was trimmed

    @property
    def dropped(self) -> int:
        return self.head + self.tail


def trim_level(rs: Sequence[RequestRecord], trim: Trim) -> Trimmed:
    """The records whose start lies inside the level's window less `trim` at each end (see the module)."""
    counted = [r for r in rs if r.error_kind not in records.CLIENT_SIDE]
    if not counted:
        return Trimmed(list(rs), 0, 0, 0.0)
    first = min(r.start_ns for r in counted)
    last = max(r.complete_ns for r in counted)
    cut_ns = trim.cut_s((last - first) / 1e9) * 1e9
    low, high = first + cut_ns, last - cut_ns
    head = [r for r in rs if r.start_ns < low]
    tail = [r for r in rs if r.start_ns > high and r.start_ns >= low]
    kept = [r for r in rs if low <= r.start_ns <= high]
    if not any(r.error_kind not in records.CLIENT_SIDE for r in kept):
        return Trimmed(list(rs), 0, 0, cut_ns / 1e9, too_short=True)
    return Trimmed(kept, len(head), len(tail), cut_ns / 1e9)
