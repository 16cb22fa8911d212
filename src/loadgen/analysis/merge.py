"""A level split over worker processes, and what they gathered merged back (pure functions).

With `--workers N` a level's load is shared out so that together the workers offer exactly what
one process would: a closed loop's C workers are dealt out as evenly as they go (C=10 on 4
processes: 3, 3, 2, 2) with the request budget in proportion; an open loop's schedule is dealt
out request by request (process k sends requests k, k+N, k+2N, ... at their own intended times), so
the merged intended send times are the one-process schedule exactly, not N copies of the rate.
Every process counts its requests 0, 1, 2, ...; the level numbers them as one process would: with
a request budget each process's requests follow the previous process's (0..11, 12..23, ...), else
request s of process k of N is request s×N + k of the level, which for an open loop is its place
in the schedule.

What comes back is merged without losing exactness: records are concatenated, HdrHistograms are
added bucket by bucket (never percentiles averaged), counters summed; the client's own load stays
per process, and the level's is its busiest process's (the one that would limit the figures).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hdrh.histogram import HdrHistogram

from . import metrics


@dataclass(frozen=True, slots=True)
class Share:
    """One process's part of a level.

    index, of        its place among the processes that take part in this level (0 ≤ index < of)
    concurrency      closed loop: how many of the level's workers it runs; open loop: its cap on
                     requests in flight (0: none)
    first_worker     closed loop: the level-wide number of its first worker (records' `worker`)
    requests         closed loop with a request budget: its part of it; None otherwise
    first_seq        with that budget: the level-wide number of its first request (None: interleaved)
    offsets_ns       open loop: its requests' intended send times since the level's start
    start_after_ns   closed loop with a stagger: its first worker's first send, after the level's start
    stagger_s        closed loop: the stagger over its own workers (the level's, in proportion)
    """

    index: int
    of: int
    concurrency: int
    first_worker: int = 0
    requests: int | None = None
    first_seq: int | None = None
    offsets_ns: tuple[int, ...] | None = None
    start_after_ns: int = 0
    stagger_s: float = 0.0


def split_count(total: int, parts: int) -> list[int]:
    """`total` dealt out over `parts` as evenly as it goes, the larger parts first: 10 on 4 → 3,3,2,2."""
    if parts < 1:
        raise ValueError("at least one part")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_in_proportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights`, summing to `total` exactly (largest remainders
    first, the earlier part on a tie)."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[:total - sum(parts)]:
        parts[i] += 1
    return parts


def closed_shares(concurrency: int, processes: int, requests: int | None, stagger_s: float) -> list[Share]:
    """A closed-loop level over at most `processes` processes (never one without a worker).

    Worker i of the level keeps its one-process start with a stagger: the process holding workers
    f..f+c-1 starts its first at f×S/C after the level's start and spreads its own over c×S/C.
    """
    counts = [c for c in split_count(concurrency, min(processes, concurrency)) if c]
    budgets = split_in_proportion(requests, counts) if requests is not None else [None] * len(counts)
    shares, first, first_seq = [], 0, 0
    for index, (count, budget) in enumerate(zip(counts, budgets)):
        shares.append(Share(index=index, of=len(counts), concurrency=count, first_worker=first, requests=budget,
                            first_seq=None if budget is None else first_seq,
                            start_after_ns=round(first * stagger_s * 1e9 / concurrency),
                            stagger_s=count * stagger_s / concurrency))
        first += count
        first_seq += budget or 0
    return shares


def open_shares(offsets_ns: Sequence[int], processes: int, max_in_flight: int | None) -> list[Share]:
    """An open-loop schedule dealt out request by request: process k sends requests k, k+N, ...

    A cap on requests in flight is split like a concurrency, so no more processes take part than it
    allows (and than there are requests).
    """
    n = max(1, min(processes, len(offsets_ns), max_in_flight or processes))
    caps = split_count(max_in_flight, n) if max_in_flight else [0] * n
    return [Share(index=k, of=n, concurrency=caps[k], offsets_ns=tuple(int(x) for x in offsets_ns[k::n]))
            for k in range(n)]


def level_seq(local_seq: int, share: Share) -> int:
    """The level-wide number of a process's request `local_seq`."""
    if share.first_seq is not None:
        return share.first_seq + local_seq
    return local_seq * share.of + share.index


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


def add_histograms(histograms: Iterable[HdrHistogram]) -> HdrHistogram:
    """The sum of histograms of the same layout: every bucket's counts added."""
    total = metrics.new_histogram()
    for h in histograms:
        total.add(h)
    return total


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


@dataclass(frozen=True, slots=True)
class ProcessLoad:
    """One process's own load during a level (see run/looplag.py)."""

    process: int
    loop_lag_p99_ms: float | None
    loop_lag_max_ms: float | None
    client_cpu_fraction: float | None


def busiest(loads: Sequence[ProcessLoad]) -> ProcessLoad | None:
    """The process most likely to have limited the level: the highest lag p99, then CPU share."""
    if not loads:
        return None
    return max(loads, key=lambda x: (x.loop_lag_p99_ms or 0.0, x.client_cpu_fraction or 0.0, -x.process))
