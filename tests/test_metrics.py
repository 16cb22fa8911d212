"""Derived metrics are pure functions over records: tested without a network."""

from __future__ import annotations

import math

import pytest

from loadgen.analysis import aggregate, metrics
from loadgen.core import records
from loadgen.core.records import RequestRecord

MS = 1_000_000


def rec(send_ms: float, complete_ms: float, *, prompt_ms=10.0, predicted_ms=90.0, predicted_n=16,
        error_kind=None, pps=170.0, seq=0) -> RequestRecord:
    return RequestRecord(target="t", level=1, worker=0, seq=seq, salt=f"s{seq}", send_ns=int(send_ms * MS),
                         complete_ns=int(complete_ms * MS), status=200 if error_kind is None else 500,
                         error_kind=error_kind, prompt_ms=prompt_ms, predicted_ms=predicted_ms,
                         predicted_n=predicted_n, predicted_per_second=pps)


def test_latency_is_complete_minus_send():
    assert metrics.latency_ms(rec(1000, 1250)) == pytest.approx(250.0)


def test_queue_wait_is_latency_minus_server_time():
    assert metrics.queue_wait_ms(rec(0, 400, prompt_ms=50, predicted_ms=100)) == pytest.approx(250.0)


def test_queue_wait_is_clamped_at_zero_when_server_time_exceeds_latency():
    assert metrics.queue_wait_ms(rec(0, 90, prompt_ms=50, predicted_ms=100)) == 0.0


def test_queue_wait_is_none_without_timings_or_for_a_failure():
    assert metrics.queue_wait_ms(rec(0, 90, prompt_ms=None)) is None
    assert metrics.queue_wait_ms(rec(0, 90, error_kind="http_500")) is None


def test_level_wall_spans_first_send_to_last_completion():
    rs = [rec(100, 300), rec(150, 900), rec(120, 500)]
    assert metrics.level_wall_s(rs) == pytest.approx(0.8)
    assert metrics.level_wall_s([]) == 0.0


def test_throughput_counts_only_successful_tokens_over_the_whole_wall():
    rs = [rec(0, 500, predicted_n=10), rec(0, 1000, predicted_n=30), rec(0, 2000, predicted_n=99, error_kind="timeout")]
    # the failed request still stretches the wall to 2 s, but adds no tokens
    assert metrics.output_tokens(rs) == 40
    assert metrics.throughput_tok_s(rs) == pytest.approx(20.0)


def test_output_tokens_falls_back_to_tokens_predicted():
    r = RequestRecord(target="t", level=1, worker=0, seq=0, salt="x", send_ns=0, complete_ns=MS, tokens_predicted=7)
    assert metrics.output_tokens([r]) == 7


def test_distribution_percentiles_come_from_hdr_with_microsecond_resolution():
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    d = metrics.distribution_ms(values)
    assert d.count == 100
    assert d.mean == pytest.approx(50.5)
    assert d.p50 == pytest.approx(50.0, rel=1e-3)
    assert d.p99 == pytest.approx(99.0, rel=1e-3)
    assert d.max == pytest.approx(100.0, rel=1e-3)
    assert metrics.distribution_ms([]) is None


def test_summarize_level_counts_errors_by_kind_and_keeps_cancelled_apart():
    rs = [rec(0, 100, seq=0), rec(0, 200, seq=1, error_kind="http_503"), rec(0, 300, seq=2, error_kind="http_503"),
          rec(0, 50, seq=3, error_kind=records.CANCELLED), rec(0, 120, seq=4, error_kind=records.CONNECT_ERROR)]
    s = aggregate.summarize_level(4, rs)
    assert (s.requests_ok, s.requests_failed, s.requests_cancelled) == (1, 3, 1)
    assert s.errors_by_kind == {"connect_error": 1, "http_503": 2}
    assert s.latency_ms.count == 1
    assert s.output_tokens == 16


def test_summarize_level_means_skip_missing_values():
    rs = [rec(0, 100, pps=100.0, seq=0), rec(0, 100, pps=None, seq=1), rec(0, 100, pps=200.0, seq=2)]
    s = aggregate.summarize_level(2, rs)
    assert s.decode_tok_s_mean == pytest.approx(150.0)
    assert s.predicted_ms_mean == pytest.approx(90.0)
    d = s.to_dict()
    assert d["latency_ms"]["p50"] == pytest.approx(100.0, rel=1e-3)
    assert not any(isinstance(v, float) and math.isnan(v) for v in d.values())


def test_counter_delta_subtracts_matching_counters():
    before = {"llamacpp:tokens_predicted_total": 100.0, "llamacpp:n_decode_total": 5.0}
    after = {"llamacpp:tokens_predicted_total": 164.0, "llamacpp:n_decode_total": 9.0, "other": 1.0}
    assert metrics.counter_delta(before, after) == {"llamacpp:n_decode_total": 4.0,
                                                   "llamacpp:tokens_predicted_total": 64.0}
    assert metrics.counter_delta(None, after) == {}


def test_cancelled_requests_do_not_stretch_the_level_wall():
    rs = [rec(0, 1000, predicted_n=20, seq=0), rec(0, 5000, seq=1, error_kind=records.CANCELLED)]
    s = aggregate.summarize_level(2, rs, stopped_reason="interrupted")
    assert s.wall_s == pytest.approx(1.0)
    assert s.throughput_tok_s == pytest.approx(20.0)
    assert (s.requests_ok, s.requests_failed, s.requests_cancelled) == (1, 0, 1)


def test_metrics_parser_keeps_unlabelled_finite_samples_with_llama_server_names():
    from loadgen.client.probe import parse_metrics

    text = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 1.23457e+06
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds +Inf
"""
    values = parse_metrics(text)
    assert values == {"llamacpp:tokens_predicted_total": 1234570.0, "llamacpp:requests_deferred": 3.0}


def test_counter_delta_skips_gauges():
    before = {"llamacpp:requests_deferred": 0.0, "llamacpp:n_decode_total": 1.0}
    after = {"llamacpp:requests_deferred": 3.0, "llamacpp:n_decode_total": 5.0}
    assert metrics.counter_delta(before, after) == {"llamacpp:n_decode_total": 4.0}
