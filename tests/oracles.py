"""Test-only oracles and helpers: the inverses and independent sums the tests check loadgen's own
functions against. They lived in src/ though nothing but the tests called them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen.analysis.compare import NoiseFloors, RunComparison, RunData, compare_sides
from loadgen.core.records import RequestRecord
from loadgen.run.workers.merge import Share, level_seq


def realised_rate(offsets_ns: np.ndarray) -> float | None:
    """A schedule's (or a level's actual sends') rate: (n - 1) / (last - first), req/s; None below 2."""
    if len(offsets_ns) < 2 or offsets_ns[-1] <= offsets_ns[0]:
        return None
    return (len(offsets_ns) - 1) / ((int(offsets_ns[-1]) - int(offsets_ns[0])) / 1e9)


def process_of(seq: int, processes: int) -> int:
    """Which of a level's `processes` sent its request `seq` when they are interleaved (an open
    loop, or a closed loop run for a duration): the inverse of `level_seq` there."""
    return seq % processes


def merged_schedule(shares: Sequence[Share]) -> list[int]:
    """The open-loop offsets of every share, back in level order (request seq at place seq)."""
    merged: dict[int, int] = {}
    for share in shares:
        for local, offset in enumerate(share.offsets_ns or ()):
            merged[level_seq(local, share)] = offset
    return [merged[seq] for seq in sorted(merged)]


def same_buckets(a: HdrHistogram, b: HdrHistogram) -> bool:
    """Whether two histograms hold the same count in every bucket."""
    return a.get_total_count() == b.get_total_count() and list(a.counts) == list(b.counts)


def sum_counters(parts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counters of several processes summed key by key (keys in first-seen order)."""
    total: dict[str, int] = {}
    for part in parts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total


def compare_runs(baseline: Mapping[str, Any], baseline_records: Sequence[RequestRecord],
                 candidate: Mapping[str, Any], candidate_records: Sequence[RequestRecord], *,
                 confidence: float = 0.95, floors: NoiseFloors | None = None,
                 only: Iterable[str] | None = None) -> RunComparison:
    """One run a side: `compare_sides` of one run each."""
    return compare_sides([RunData(baseline, baseline_records)], [RunData(candidate, candidate_records)],
                         confidence=confidence, floors=floors, only=only)
