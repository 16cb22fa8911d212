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

A process that dies takes its in-flight requests with it: `lost_requests` rebuilds them from the
last `SendsSoFar` it sent (what it had sent and had in flight then) and the records it wrote
after that, so every request it sent is a record (error kind "lost") and none vanishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
from hdrh.histogram import HdrHistogram

from ...analysis import metrics
from ...core.records import CONNECT_ERROR, LOST, RequestRecord, ServerOutcome, make_record

if TYPE_CHECKING:  # for annotations only
    import numpy as np


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


def open_shares(offsets_ns: Sequence[int] | np.ndarray, processes: int, max_in_flight: int | None) -> list[Share]:
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


def local_seq(seq: int, share: Share) -> int:
    """The process's own number of the level's request `seq` (the inverse of `level_seq`)."""
    if share.first_seq is not None:
        return seq - share.first_seq
    return (seq - share.index) // share.of


class SendsSoFar(msgspec.Struct, array_like=True):
    """What a process had sent when it sent a part of its records (on its own clock), in its own
    numbers: `sent` requests, of which `in_flight` (seq -> worker, salt, send_ns, intended_ns) had
    no record yet; every record it wrote before is in that part. A few numbers a request in
    flight, a few times a second: never a message a request."""

    at_ns: int
    sent: int
    in_flight: dict[int, tuple[int, str, int, int | None]]


def lost_requests(share: Share, sends: SendsSoFar | None, since: Sequence[RequestRecord], *, target: str,
                  key: int | float, start_ns: int, death_ns: int, duration_s: float | None, reason: str,
                  pause_after_connect_error_ns: int = 0) -> list[RequestRecord]:
    """The requests a process that died at `death_ns` had sent and never recorded, as records of
    error kind "lost" (completed at `death_ns`, `reason` their message), numbered as the level's.

    `sends` is its last `SendsSoFar` (None: it sent none), `since` the records it wrote after it
    (the level's numbers). What it sent after `sends` follows from its share: a closed loop's
    worker sends its next request the moment one completes (after the pause when it could not
    connect) while the budget and the duration last, numbered in completion order; an open loop
    sends its schedule's requests at their times, never more in flight than its cap.
    """
    recorded = {local_seq(r.seq, share) for r in since}
    if share.offsets_ns is not None:
        lost = _lost_in_open_loop(share, sends, recorded, start_ns, death_ns)
    else:
        lost = _lost_in_closed_loop(share, sends, since, recorded, start_ns, death_ns, duration_s,
                                    pause_after_connect_error_ns)
    outcome = ServerOutcome(error_kind=LOST, error_message=reason)
    return [make_record(target, key, share.first_worker + worker, level_seq(seq, share), salt, send, max(send, death_ns),
                        None, outcome, intended_ns=intended)
            for seq, worker, salt, send, intended in sorted(lost)]


_Lost = tuple[int, int, str, int, int]  # (own seq, own worker, salt, send_ns, intended_ns)


def _lost_in_open_loop(share: Share, sends: SendsSoFar | None, recorded: set[int], start_ns: int,
                       death_ns: int) -> list[_Lost]:
    """Requests leave in schedule order: those in flight at the part, and every one due since."""
    in_flight = {} if sends is None else sends.in_flight
    candidates = {seq: (salt, send, send if intended is None else intended)
                  for seq, (_, salt, send, intended) in in_flight.items()}
    offsets = share.offsets_ns or ()
    for seq in range(0 if sends is None else sends.sent, len(offsets)):
        due = start_ns + offsets[seq]
        if due > death_ns:
            break
        candidates[seq] = ("", due, due)
    unrecorded = sorted(seq for seq in candidates if seq not in recorded)
    if share.concurrency:
        unrecorded = unrecorded[:share.concurrency]  # sent in order, never more in flight than the cap
    return [(seq, 0, *candidates[seq]) for seq in unrecorded]


def _lost_in_closed_loop(share: Share, sends: SendsSoFar | None, since: Sequence[RequestRecord], recorded: set[int],
                         start_ns: int, death_ns: int, duration_s: float | None, pause_ns: int) -> list[_Lost]:
    """Each worker's last request: the one in flight at the part, or the one it sent after its
    last record since (numbered in completion order), or its first if it started since."""
    at = None if sends is None else sends.at_ns
    in_flight = {} if sends is None else sends.in_flight
    c = share.concurrency
    first_seqs = c if share.requests is None else min(c, share.requests)
    begin = start_ns + share.start_after_ns
    step = share.stagger_s * 1e9 / max(1, c)
    deadline = None if duration_s is None else start_ns + int(duration_s * 1e9)
    first_send = {j: begin + int(j * step) for j in range(first_seqs)}
    # the closed loop's counter: the first seqs are held for their workers, sent or not
    issued = (0 if sends is None else sends.sent) + sum(1 for t in first_send.values() if at is None or t > at)
    next_send: dict[int, tuple[int | None, int]] = {}  # own worker -> its next request after `sends`
    for r in sorted(since, key=lambda r: r.complete_ns):
        t = r.complete_ns + (pause_ns if r.error_kind == CONNECT_ERROR else 0)
        more = share.requests is None or issued < share.requests
        if more and t <= death_ns and (deadline is None or t < deadline):
            next_send[r.worker - share.first_worker] = (issued, t)
            issued += 1
        else:
            next_send[r.worker - share.first_worker] = (None, t)
    held = {worker: (seq, salt, send) for seq, (worker, salt, send, _) in in_flight.items()}
    lost: list[_Lost] = []
    for j in range(c):
        if j in next_send:
            seq, t = next_send[j]
            if seq is not None and seq not in recorded:
                lost.append((seq, j, "", t, t))
        elif j in held:
            seq, salt, t = held[j]
            if seq not in recorded:
                lost.append((seq, j, salt, t, t))
        elif j in first_send and (at is None or first_send[j] > at) and first_send[j] <= death_ns \
                and (deadline is None or first_send[j] < deadline) and j not in recorded:
            lost.append((j, j, "", first_send[j], first_send[j]))
    return lost


def add_histograms(histograms: Iterable[HdrHistogram]) -> HdrHistogram:
    """The sum of histograms of the same layout: every bucket's counts added."""
    total = metrics.new_histogram()
    for h in histograms:
        total.add(h)
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
