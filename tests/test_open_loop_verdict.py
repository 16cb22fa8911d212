"""One open-loop level judged on its own (analysis/open_loop.py) and the saturation verdict built on
it: an overloaded server is never told it keeps up, whatever the number of levels (issue #46, 1).

Every expected answer below was written down before the code was run."""

from __future__ import annotations

import pytest

from loadgen.analysis import open_loop
from loadgen.analysis.open_loop import AT_LIMIT, KEEPS_UP, OVERLOADED, TOO_SHORT, decide, judge_level
from loadgen.analysis.saturation import analyze_target
from loadgen.core.records import RequestRecord

S = 1_000_000_000  # ns


# offered req/s, served req/s, backlog grew, successful requests -> verdict
DECISIONS = [
    (2.0, 2.0, False, 30, KEEPS_UP),  # served all of it, no growth
    (2.0, 1.85, False, 30, KEEPS_UP),  # 92.5%: within a short level's spread
    (2.0, 1.85, True, 30, AT_LIMIT),  # served about all, but the backlog grew: never "keeps up"
    (2.0, 1.7, True, 30, OVERLOADED),  # 85% and growing
    (2.0, 1.7, False, 30, AT_LIMIT),  # 85% with no growth seen: not keeping up, not yet proven overloaded
    (2.0, 1.0, False, 30, OVERLOADED),  # half: overloaded whatever the latencies did
    (1.56, 0.13, True, 30, OVERLOADED),  # the replay
    (5.0, 1.36, True, 30, OVERLOADED),  # the 1-slot simulator at --rate 5
    (2.0, 2.0, False, 5, TOO_SHORT),  # five answers: too few to tell
    (None, 3.0, False, 30, TOO_SHORT),  # every request at once: no rate to keep up with
    (2.0, None, False, 30, TOO_SHORT),  # no served rate (one answer, or all at one instant)
]


@pytest.mark.parametrize("offered, served, grew, ok, expected", DECISIONS)
def test_the_decision_table(offered, served, grew, ok, expected):
    assert decide(offered, served, grew, ok) == expected


# first third's median ms, last third's, offered req/s -> the backlog grew
GROWTH = [
    (500.0, 500.0, 2.0, False),
    (500.0, 740.0, 2.0, False),  # under x1.5
    (500.0, 760.0, 2.0, False),  # x1.52 but only 260 ms longer: less than one 500 ms gap between sends
    (500.0, 1100.0, 2.0, True),  # x2.2 and 600 ms longer than a gap
    (100.0, 160.0, 20.0, True),  # x1.6, 60 ms over a 50 ms gap
    (None, 900.0, 2.0, False),
]


@pytest.mark.parametrize("first, last, offered, expected", GROWTH)
def test_the_backlog_rule(first, last, offered, expected):
    assert open_loop.backlog_grew(first, last, offered) == expected


def _record(i: int, intended_s: float, complete_s: float, level: float = 2.0, ok: bool = True) -> RequestRecord:
    return RequestRecord("t", level, 0, i, f"s{i}", send_ns=round(intended_s * S), complete_ns=round(complete_s * S),
                         intended_ns=round(intended_s * S), predicted_n=16, prompt_ms=5.0, predicted_ms=50.0,
                         error_kind=None if ok else "http_503")


def _fifo(rate: float, service_s: float, n: int, level: float | None = None) -> list[RequestRecord]:
    """n requests sent every 1/rate s to a one-slot server that takes service_s each, first come first served."""
    out, free_at = [], 0.0
    for i in range(n):
        at = i / rate
        done = max(at, free_at) + service_s
        free_at = done
        out.append(_record(i, at, done, level if level is not None else rate))
    return out


def test_a_server_that_answers_as_requests_come_keeps_up():
    j = judge_level(2.0, 2.0, _fifo(2.0, 0.3, 30))
    assert (j.verdict, round(j.served_rate, 3), j.backlog_grew) == (KEEPS_UP, 2.0, False)


def test_a_server_at_half_the_offer_is_overloaded_with_its_own_rate():
    j = judge_level(2.0, 2.0, _fifo(2.0, 1.0, 30))
    assert j.verdict == OVERLOADED
    assert j.served_rate == pytest.approx(1.0)
    assert j.backlog_grew
    assert (j.latency_first_ms, j.latency_last_ms) == (3000.0, 13000.0)  # the 5th and 25th of 30: 1 s + 2 s and 12 s of queue


def test_slightly_slower_than_the_offer_is_at_its_limit():
    # 0.55 s a request against a request every 0.5 s: 91% served, the queue grows 50 ms a request:
    # the 5th request waits 0.75 s, the 25th 1.75 s (x2.3, a whole second more than a 0.5 s gap).
    j = judge_level(2.0, 2.0, _fifo(2.0, 0.55, 30))
    assert j.served_rate == pytest.approx(1 / 0.55)
    assert (j.latency_first_ms, j.latency_last_ms) == pytest.approx((750.0, 1750.0))
    assert (j.verdict, j.backlog_grew) == (AT_LIMIT, True)


def test_every_request_at_once_says_only_what_was_served():
    rs = [_record(i, 0.0, 0.5 * (i + 1), level=float("inf")) for i in range(10)]
    j = judge_level(float("inf"), float("inf"), rs)
    assert (j.verdict, j.offered_rate, j.served_rate) == (TOO_SHORT, None, pytest.approx(2.0))


def test_a_sample_of_the_level_is_scaled_by_its_count():
    every = _fifo(2.0, 1.0, 300)
    sample = every[::10]  # 30 of 300, spread over the level as the reservoir's uniform sample is
    j = judge_level(2.0, 2.0, sample, requests_ok=300)
    assert j.verdict == OVERLOADED
    assert j.served_rate == pytest.approx(1.0, rel=0.02)


def test_without_a_nominal_rate_the_intended_sends_give_it():
    assert open_loop.offered_rate(None, _fifo(4.0, 0.1, 9)) == pytest.approx(4.0)


def _summary(rate: float, rs: list[RequestRecord]) -> dict:
    wall = (max(r.complete_ns for r in rs) - min(r.start_ns for r in rs)) / 1e9
    latencies = sorted((r.complete_ns - r.start_ns) / 1e6 for r in rs)
    mean = sum(latencies) / len(latencies)
    return {"level": rate, "concurrency": 0, "rate": rate, "requests_ok": len(rs), "requests_failed": 0,
            "throughput_tok_s": 16 * len(rs) / wall, "latency_ms": {"mean": mean, "p99": latencies[-1]},
            "concurrency_reached": 3}


def test_one_overloaded_level_is_named_overloaded_not_keeps_up():
    rs = _fifo(5.0, 1 / 1.36, 30)
    v = analyze_target("sim", [_summary(5.0, rs)], rs, [], 1, True, open_loop=True)
    assert not any("keeps up" in line for line in v.lines), v.lines
    assert v.lines[0].startswith("sim is overloaded at 5 req/s: served 1.36 of 5 req/s offered; latency rose from ")
    assert v.knee is not None and v.knee.at == 5.0 and v.knee.at_or_below
    assert not any("saturates" in line for line in v.lines)  # one level: its own line says it
    assert v.to_dict()["levels"][0]["open_loop"]["verdict"] == OVERLOADED


def test_the_knee_and_the_levels_never_contradict_each_other():
    low, mid, high = _fifo(1.0, 0.5, 30), _fifo(1.25, 0.95, 30), _fifo(2.0, 0.95, 30)
    rs = low + mid + high
    v = analyze_target("sim", [_summary(1.0, low), _summary(1.25, mid), _summary(2.0, high)], rs, [], 1, True,
                       open_loop=True)
    verdicts = {lv.level: lv.open_loop.verdict for lv in v.levels}
    assert verdicts == {1.0: KEEPS_UP, 1.25: OVERLOADED, 2.0: OVERLOADED}
    assert v.knee is not None and (v.knee.at, v.knee.between) == (1.25, (1.0, 1.25))
    assert v.lines[0] == "sim keeps up at 1 req/s: it served what was offered and no backlog grew."
    assert "sim saturates between 1 req/s and 1.25 req/s: requests arrive faster than it answers them." in v.lines


def test_a_replay_is_said_in_the_trace_s_words():
    rs = _fifo(1.56, 1 / 0.13, 30)
    v = analyze_target("sim", [_summary(1.56, rs)], rs, [], 2, True, open_loop=True, trace=True)
    assert v.lines[0].startswith("sim is overloaded replaying the trace: served 0.13 of 1.56 req/s offered;")
    assert "up to 3 requests in flight" in v.lines[0]
    assert not any("saturates" in line for line in v.lines)


def test_a_replay_that_keeps_up_says_so():
    rs = _fifo(1.0, 0.2, 20)
    v = analyze_target("sim", [_summary(1.0, rs)], rs, [], 2, True, open_loop=True, trace=True)
    assert v.lines[0] == "sim keeps up with the trace: served 1 of 1 req/s offered, no backlog."
