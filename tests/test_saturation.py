"""Knee and queue logic on synthetic level data: no server."""

from __future__ import annotations

import pytest

from loadgen.analysis.saturation import LevelPoint, analyze_target, find_knee, is_queued, overhead_ms
from loadgen.core.records import ProbeSample, RequestRecord

MS = 1_000_000


def points(*rows):
    return [LevelPoint(c, tput, lat) for c, tput, lat in rows]


def test_knee_at_the_slot_count_like_the_moe_field_report():
    # throughput 42 -> 57 -> 72 -> 71 tok/s; wall latency doubles from 4 to 8 once requests queue
    knee = find_knee(points((1, 42.3, 1930), (2, 56.5, 2880), (4, 72.2, 4340), (8, 71.4, 8700)))
    assert knee.at == 4 and knee.next_level == 8
    assert knee.throughput_gain == pytest.approx(71.4 / 72.2 - 1)
    assert knee.latency_ratio == pytest.approx(8700 / 4340)


def test_flat_from_the_start_saturates_at_the_first_level():
    knee = find_knee(points((1, 100, 160), (2, 101, 320), (4, 100, 640)))
    assert knee.at == 1


def test_noisy_but_scaling_levels_give_no_false_knee():
    # throughput wobbles by a few percent with latency rising moderately: no knee
    assert find_knee(points((1, 100, 100), (2, 104, 130), (4, 109, 140), (8, 112, 160))) is None
    # throughput flat but latency barely moves (noise): not a knee either
    assert find_knee(points((1, 100, 100), (2, 101, 120))) is None


def test_throughput_that_falls_after_the_knee_still_marks_the_first_flat_level():
    knee = find_knee(points((1, 10, 100), (2, 18, 110), (4, 17, 230), (8, 15, 520)))
    assert knee.at == 2 and knee.throughput_gain < 0


def test_knee_thresholds_are_parameters():
    rows = points((1, 100, 100), (2, 115, 200))
    assert find_knee(rows) is None
    assert find_knee(rows, knee_gain=0.2).at == 1


def rec(level, seq, send_ms, latency_ms, prompt_ms=10.0, predicted_ms=100.0, error_kind=None, worker=None):
    return RequestRecord(target="a", level=level, worker=seq % level if worker is None else worker, seq=seq, salt=str(seq),
                         send_ns=int(send_ms * MS), complete_ns=int((send_ms + latency_ms) * MS),
                         status=200, error_kind=error_kind, prompt_ms=prompt_ms, predicted_ms=predicted_ms,
                         predicted_n=16, predicted_per_second=150.0)


def test_overhead_is_the_median_raw_wait_at_concurrency_1():
    rs = [rec(1, i, i * 200, 110 + extra) for i, extra in enumerate([2, 3, 4, 50])]
    assert overhead_ms(rs) == pytest.approx(3.5)


def test_queued_means_corrected_wait_above_20ms_and_10pct_of_service():
    assert not is_queued(rec(4, 0, 0, 110 + 25), overhead=10.0)  # 15 ms corrected: under 20 ms
    assert is_queued(rec(4, 0, 0, 110 + 35), overhead=10.0)  # 25 ms > max(20, 11)
    long = rec(4, 0, 0, 1000 + 90, prompt_ms=100, predicted_ms=900)
    assert not is_queued(long, overhead=0.0)  # 90 ms < 10% of a 1000 ms service time


def level_doc(c, tput, lat_mean):
    return {"concurrency": c, "throughput_tok_s": tput, "latency_ms": {"mean": lat_mean}}


def closed_loop(c, slots, n, service_ms=110.0, overhead_ms=3.0, seq0=0, level=None):
    """The records of a closed loop of `c` workers on a FIFO server of `slots` slots, each request
    taking `overhead_ms` to reach the server and `service_ms` in a slot: a consistent timeline, so
    the records' own evidence (analysis/occupancy.py) sees what the server did."""
    import heapq
    free = [0.0] * slots  # when each slot frees
    workers = [(0.0, w) for w in range(c)]  # (next send, worker)
    heapq.heapify(workers)
    out = []
    for k in range(n):
        send, w = heapq.heappop(workers)
        ready = send + overhead_ms
        slot = min(range(slots), key=lambda i: free[i])
        start = max(ready, free[slot])
        done = start + service_ms
        free[slot] = done
        out.append(rec(level or c, seq0 + k, send, done - send, prompt_ms=10.0, predicted_ms=service_ms - 10.0,
                       worker=w))
        heapq.heappush(workers, (done, w))
    return out


def one_slot_run():
    """A 1-slot server: requests at c=2 and c=4 wait for 1 and 3 others (service 110 ms, overhead 3 ms)."""
    records = []
    for c in (1, 2, 4):
        records += closed_loop(c, 1, 8, seq0=len(records))
    samples = [ProbeSample("a", 4, i, requests_processing=1, requests_deferred=3, busy_slots=1) for i in range(3)]
    levels = [level_doc(1, 145, 113), level_doc(2, 146, 223), level_doc(4, 145, 443)]
    return levels, records, samples


def test_one_slot_verdict_names_the_slot_and_the_queue():
    levels, records, samples = one_slot_run()
    v = analyze_target("a", levels, records, samples, total_slots=1, metrics_available=True)
    assert v.knee.at == 1
    assert v.overhead_ms == pytest.approx(3.0)
    c4 = v.levels[2]
    # the first request of the level found the slot free; the other 7 waited for it
    assert (c4.queued, c4.slot_queued, c4.requests, c4.peak_deferred, c4.peak_busy_slots) == (7, 7, 8, 3, 1)
    assert c4.evidence == "records" and c4.queue_cause == "slots" and c4.held_outside == 0
    assert c4.queue_wait_ms.p50 == pytest.approx(330, rel=0.01)
    assert v.lines[0] == "a saturates at concurrency 1 = its 1 slot."
    assert v.lines[1] == "a from c=2: throughput +1%, latency ×2.0."
    assert not any("deferred" in line for line in v.lines)  # at c=2 the probe saw no deferred requests here
    assert all(len(line) <= 100 for line in v.lines), v.lines  # one fact a line, readable at 100 columns
    assert any("batching gain" in line for line in v.lines)


def test_knee_below_the_slot_count_blames_compute():
    # 4 slots, compute-bound: every request runs at once, each slower by the others (no slot wait)
    levels, _, _ = one_slot_run()
    records = []
    for c in (1, 2, 4):
        records += closed_loop(c, 4, 8, service_ms=110.0 * c, seq0=len(records))
    v = analyze_target("a", levels, records, [], total_slots=4, metrics_available=True)
    assert v.lines[0] == "a saturates at concurrency 1, below its 4 slots."
    assert "compute, not slots" in v.lines[1]
    assert all(len(line) <= 100 for line in v.lines), v.lines


def test_unsaturated_server_and_missing_metrics_are_said():
    levels = [level_doc(1, 100, 110), level_doc(2, 190, 115)]
    records = [rec(c, i, i * 300, 113) for c in (1, 2) for i in range(4)]
    v = analyze_target("b", levels, records, [], total_slots=4, metrics_available=False)
    assert v.knee is None
    assert v.lines[0] == "b is not saturated up to concurrency 2; it has 4 slots."
    unknown = analyze_target("b", levels, records, [], total_slots=None, metrics_available=False)
    assert unknown.lines[0] == "b is not saturated up to concurrency 2; its slot count is unknown."
    assert all(q.queued == 0 for q in v.levels)
    assert any("/metrics unavailable" in line for line in v.lines)
    assert v.levels[1].batching_gain == pytest.approx(1.9)


def test_a_level_with_many_failures_is_called_untrustworthy():
    levels = [level_doc(1, 100, 110)]
    records = [rec(1, i, i * 300, 113, error_kind="http_500" if i < 3 else None) for i in range(10)]
    v = analyze_target("c", levels, records, [], total_slots=1, metrics_available=True)
    assert any("30% of requests failed" in line for line in v.lines)


def test_waits_without_deferred_tasks_are_not_blamed_on_slots():
    levels = [level_doc(1, 100, 113), level_doc(2, 101, 300)]
    records = [rec(1, i, i * 300, 113) for i in range(4)] + [rec(2, 10 + i, i * 300, 113 + 150) for i in range(4)]
    samples = [ProbeSample("a", 2, i, requests_processing=2, requests_deferred=0, busy_slots=2) for i in range(3)]
    v = analyze_target("a", levels, records, samples, total_slots=4, metrics_available=True)
    # the records show no other request in service while each waited: the 150 ms were spent
    # outside the server, so they are neither queue wait nor a knee
    assert v.knee is None
    assert v.levels[1].queue_cause == "outside" and v.levels[1].held_outside == 4
    assert not any("queue wait" in line for line in v.lines)
    assert v.levels[1].held_outside_max_ms == pytest.approx(150.0)
    assert not any("outside the server" in line for line in v.lines)  # under 250 ms: the table's, not a line's
    # the same level judged from scrapes only (no slot count known to the records): not for a slot
    by_scrapes = analyze_target("a", levels, records, samples, total_slots=None, metrics_available=True)
    assert any(line.startswith("a at c=2: 4 of 4 requests waited to start (median")
               and line.endswith("not for a slot.") for line in by_scrapes.lines), by_scrapes.lines


def test_the_servers_full_slots_make_a_knee_even_when_throughput_creeps_up():
    # A 1-slot llama-server: c=2 gains 11% (HTTP and tokenization overlap the busy slot) while
    # latency rises 1.7x; the server says its slot was full and requests were deferred.
    pts = points((1, 18.7, 854), (2, 20.8, 1453), (4, 24.6, 2360))
    assert find_knee(pts) is None
    knee = find_knee(pts, slots_full={2, 4})
    assert knee is not None and (knee.at, knee.next_level) == (1, 2)
    assert find_knee(points((1, 18.7, 854), (2, 30.0, 1000)), slots_full={2}) is None  # latency barely rose


@pytest.mark.parametrize("slots", [1, 4, None])
def test_every_verdict_line_reads_at_100_columns_with_the_longest_default_label(slots):
    """One fact a line: with a 24-character label (run.labels.MAX_LABEL) no line passes 100 columns."""
    levels, records, samples = one_slot_run()
    label = "SmolLM2-135M…Q4_1@18280"
    v = analyze_target(label, levels, records, samples, total_slots=slots,
                       metrics_available=True)
    assert len(v.lines) >= 2
    assert all(len(line) <= 100 for line in v.lines), v.lines
