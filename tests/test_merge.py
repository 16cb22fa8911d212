"""run/workers/merge.py: how a level is shared over worker processes and merged back (no processes here).

The expected answers in the tables were written down before the functions were run.
"""

from __future__ import annotations

import pytest

from loadgen.analysis import aggregate, metrics
from loadgen.core.records import RequestRecord
from loadgen.run.schedule import arrival_offsets_ns
from loadgen.run.workers import merge
from loadgen.run.workers.merge import (
    ProcessLoad,
    add_histograms,
    busiest,
    closed_shares,
    level_seq,
    open_shares,
    split_count,
    split_in_proportion,
)
from oracles import merged_schedule, process_of, same_buckets, sum_counters


@pytest.mark.parametrize("total, parts, expected", [
    (10, 4, [3, 3, 2, 2]),
    (8, 2, [4, 4]),
    (3, 4, [1, 1, 1, 0]),
    (1, 1, [1]),
    (0, 2, [0, 0]),
    (7, 3, [3, 2, 2]),
])
def test_split_count(total: int, parts: int, expected: list[int]) -> None:
    assert split_count(total, parts) == expected


@pytest.mark.parametrize("total, weights, expected", [
    (40, [3, 3, 2, 2], [12, 12, 8, 8]),
    (10, [3, 3, 2, 2], [3, 3, 2, 2]),
    (11, [3, 3, 2, 2], [4, 3, 2, 2]),  # 3.3, 3.3, 2.2, 2.2: the one left over goes to the first .3
    (7, [1, 1, 1], [3, 2, 2]),
    (5, [1], [5]),
])
def test_split_in_proportion(total: int, weights: list[int], expected: list[int]) -> None:
    assert split_in_proportion(total, weights) == expected


@pytest.mark.parametrize("concurrency, processes, requests, stagger_s, conc, first, budgets, after_ns, staggers", [
    (10, 4, 40, 0.0, [3, 3, 2, 2], [0, 3, 6, 8], [12, 12, 8, 8], [0, 0, 0, 0], [0.0] * 4),
    (3, 4, None, 0.0, [1, 1, 1], [0, 1, 2], [None] * 3, [0, 0, 0], [0.0] * 3),  # no process without a worker
    (4, 2, 8, 2.0, [2, 2], [0, 2], [4, 4], [0, 1_000_000_000], [1.0, 1.0]),  # worker i still at i x 2/4 s
    (1, 2, 5, 0.0, [1], [0], [5], [0], [0.0]),
])
def test_closed_shares(concurrency, processes, requests, stagger_s, conc, first, budgets, after_ns, staggers) -> None:
    shares = closed_shares(concurrency, processes, requests, stagger_s)
    assert [s.concurrency for s in shares] == conc
    assert [s.first_worker for s in shares] == first
    assert [s.requests for s in shares] == budgets
    assert [s.start_after_ns for s in shares] == after_ns
    assert [s.stagger_s for s in shares] == staggers
    assert all(s.of == len(conc) and s.index == i for i, s in enumerate(shares))


@pytest.mark.parametrize("n, processes, cap, offsets, caps", [
    (7, 3, None, [(0, 3, 6), (1, 4), (2, 5)], [0, 0, 0]),
    (7, 3, 2, [(0, 2, 4, 6), (1, 3, 5)], [1, 1]),  # a cap of 2 in flight: two processes, one each
    (2, 3, None, [(0,), (1,)], [0, 0]),  # never more processes than requests
    (5, 2, 5, [(0, 2, 4), (1, 3)], [3, 2]),
])
def test_open_shares(n, processes, cap, offsets, caps) -> None:
    shares = open_shares(list(range(n)), processes, cap)
    assert [s.offsets_ns for s in shares] == offsets
    assert [s.concurrency for s in shares] == caps


@pytest.mark.parametrize("arrival, processes", [("poisson", 3), ("constant", 3), ("gamma", 2), ("poisson", 1)])
def test_an_open_schedule_split_and_merged_is_the_one_process_schedule(arrival: str, processes: int) -> None:
    offsets = arrival_offsets_ns(40.0, requests=101, duration_s=None, arrival=arrival, burstiness=0.5, seed=7)
    shares = open_shares(offsets, processes, None)
    assert merged_schedule(shares) == list(offsets)
    # Every process's local request s is the schedule's request level_seq(s): same intended time.
    for share in shares:
        for local, offset in enumerate(share.offsets_ns):
            assert offsets[level_seq(local, share)] == offset
            assert process_of(level_seq(local, share), share.of) == share.index


def test_level_seqs_of_all_shares_are_distinct() -> None:
    shares = closed_shares(10, 4, 40, 0.0)
    assert [s.first_seq for s in shares] == [0, 12, 24, 32]
    seqs = [level_seq(s, share) for share in shares for s in range(share.requests)]
    assert seqs == list(range(40))  # numbered as one process numbers them
    for share in closed_shares(10, 4, None, 0.0):  # a duration: nobody knows the counts, so interleaved
        assert share.first_seq is None
        assert [level_seq(s, share) for s in range(3)] == [share.index, share.index + 4, share.index + 8]


def test_histograms_added_equal_the_histogram_of_all_values() -> None:
    parts = [[0.5, 1.25, 3.0, 3.001], [1000.0, 0.013, 77.7], [], [3.0] * 5]
    merged = add_histograms(metrics.histogram_ms(p) for p in parts)
    whole = metrics.histogram_ms([v for p in parts for v in p])
    assert same_buckets(merged, whole)
    assert merged.get_total_count() == 12
    assert not same_buckets(merged, metrics.histogram_ms(parts[0]))


def test_counters_are_summed_key_by_key() -> None:
    assert sum_counters([{"ok": 3, "http_500": 1}, {"ok": 4}, {"timeout": 2, "ok": 1}]) == \
        {"ok": 8, "http_500": 1, "timeout": 2}


@pytest.mark.parametrize("loads, expected", [
    ([ProcessLoad(0, 1.0, 2.0, 0.5), ProcessLoad(1, 3.0, 3.0, 0.2)], 1),  # the higher lag
    ([ProcessLoad(0, 1.0, 2.0, 0.5), ProcessLoad(1, 1.0, 3.0, 0.9)], 1),  # same lag: the busier CPU
    ([ProcessLoad(0, None, None, 0.3), ProcessLoad(1, None, None, 0.3)], 0),  # a tie: the first
])
def test_busiest_process(loads: list[ProcessLoad], expected: int) -> None:
    top = busiest(loads)
    assert top is not None and top.process == expected
    assert busiest([]) is None


MS = 1_000_000
_BUDGET = merge.Share(index=1, of=2, concurrency=2, first_worker=2, requests=20, first_seq=20)
_TIMED = merge.Share(index=0, of=2, concurrency=2)  # a closed loop for a duration: seqs interleaved
_STAGGERED = merge.Share(index=0, of=1, concurrency=4, stagger_s=0.4)  # first sends 100 ms apart
_OPEN = merge.Share(index=1, of=2, concurrency=0, offsets_ns=(0, 100 * MS, 200 * MS, 300 * MS))
_OPEN_CAPPED = merge.Share(index=1, of=2, concurrency=1, offsets_ns=_OPEN.offsets_ns)


def _sends(at_ms: int, sent: int, in_flight: dict[int, tuple[int, str, int, int | None]]) -> merge.SendsSoFar:
    return merge.SendsSoFar(at_ms * MS, sent, {seq: (w, salt, t * MS, None if i is None else i * MS)
                                               for seq, (w, salt, t, i) in in_flight.items()})


def _done(seq: int, worker: int, complete_ms: int, error: str | None = None) -> RequestRecord:
    return RequestRecord(target="t", level=4, worker=worker, seq=seq, salt="x", send_ns=0,
                         complete_ns=complete_ms * MS, error_kind=error)


# Expected: (level seq, level worker, salt, send ms) of every request lost, written before running.
@pytest.mark.parametrize("share, sends, since, death_ms, duration_s, pause_ms, expected", [
    # no part came: every worker's first request was in flight
    (_BUDGET, None, [], 50, None, 0, [(20, 2, "", 0), (21, 3, "", 0)]),
    # a part: its two in flight, none recorded since
    (_BUDGET, _sends(100, 5, {3: (0, "a", 80, None), 4: (1, "b", 90, None)}), [], 150, None, 0,
     [(23, 2, "a", 80), (24, 3, "b", 90)]),
    # worker 2's request completed after the part: its next one (the 6th sent) was in flight from then
    (_BUDGET, _sends(100, 5, {3: (0, "a", 80, None), 4: (1, "b", 90, None)}), [_done(23, 2, 120)], 150, None, 0,
     [(24, 3, "b", 90), (25, 2, "", 120)]),
    # one request of the budget left: only one more was sent
    (_BUDGET, _sends(100, 19, {17: (0, "", 80, None), 18: (1, "", 90, None)}), [_done(37, 2, 120)], 150, None, 0,
     [(38, 3, "", 90), (39, 2, "", 120)]),
    (_BUDGET, _sends(100, 20, {18: (0, "", 80, None), 19: (1, "", 90, None)}), [_done(38, 2, 120)], 150, None, 0,
     [(39, 3, "", 90)]),
    # a duration: a request completed after it is followed by none
    (_TIMED, _sends(100, 4, {2: (0, "", 80, None), 3: (1, "", 90, None)}), [_done(4, 0, 210)], 250, 0.2, 0,
     [(6, 1, "", 90)]),
    # could not connect: the next request waits out the pause (death before it ends; after it)
    (_TIMED, _sends(100, 4, {2: (0, "", 80, None), 3: (1, "", 90, None)}), [_done(4, 0, 120, "connect_error")],
     150, None, 50, [(6, 1, "", 90)]),
    (_TIMED, _sends(100, 4, {2: (0, "", 80, None), 3: (1, "", 90, None)}), [_done(4, 0, 120, "connect_error")],
     200, None, 50, [(6, 1, "", 90), (8, 0, "", 170)]),
    # a stagger: the workers not started yet had nothing in flight
    (_STAGGERED, None, [], 250, None, 0, [(0, 0, "", 0), (1, 1, "", 100), (2, 2, "", 200)]),
    # open loop: every request due by the death was sent
    (_OPEN, None, [], 150, None, 0, [(1, 0, "", 0), (3, 0, "", 100)]),
    (_OPEN, _sends(120, 2, {1: (0, "s", 100, 100)}), [], 250, None, 0, [(3, 0, "s", 100), (5, 0, "", 200)]),
    (_OPEN, _sends(120, 2, {1: (0, "s", 100, 100)}), [_done(3, 0, 140)], 250, None, 0, [(5, 0, "", 200)]),
    # ... never more in flight than its cap: the later one was still waiting
    (_OPEN_CAPPED, None, [], 150, None, 0, [(1, 0, "", 0)]),
])
def test_lost_requests(share, sends, since, death_ms, duration_s, pause_ms, expected) -> None:
    lost = merge.lost_requests(share, sends, since, target="t", key=4, start_ns=0, death_ns=death_ms * MS,
                               duration_s=duration_s, reason="worker 1 died (killed by SIGKILL)",
                               pause_after_connect_error_ns=pause_ms * MS)
    assert [(r.seq, r.worker, r.salt, r.send_ns // MS) for r in lost] == expected
    assert all(r.error_kind == "lost" and r.error_message == "worker 1 died (killed by SIGKILL)"
               and r.complete_ns == death_ms * MS and r.status is None for r in lost)
    assert all(r.intended_ns == r.send_ns for r in lost if share.offsets_ns is None)


def test_lost_requests_count_apart_from_failed_and_cancelled() -> None:
    records = [_done(0, 0, 10), _done(1, 0, 20, "http_503"), _done(2, 0, 30, "cancelled"), _done(3, 0, 40, "lost")]
    summary = aggregate.summarize_level(4, records)
    assert (summary.requests_ok, summary.requests_failed, summary.requests_cancelled, summary.requests_lost) == \
        (1, 1, 1, 1)
    assert summary.errors_by_kind == {"http_503": 1}
    assert summary.wall_s == 0.02  # a lost request's "completion" (when its worker was seen gone) is no end of the level
