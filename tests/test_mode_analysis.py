"""prefill, depth and soak figures as pure functions over hand-made records (no network)."""

from __future__ import annotations

import pytest

from loadgen.analysis.depth import DepthRow, skip_reason, summarize_depth, with_change
from loadgen.analysis.prefill import summarize_prefill
from loadgen.analysis.soak import summarize_soak, window_seconds
from loadgen.core import records
from loadgen.core.records import RequestRecord

S = 1_000_000_000


def rec(send_s: float, done_s: float, *, error: str | None = None, **fields) -> RequestRecord:
    return RequestRecord(target="t", level=1, worker=0, seq=0, salt="s", send_ns=int(send_s * S),
                         complete_ns=int(done_s * S), status=None if error else 200, error_kind=error, **fields)


def test_prefill_row_mean_sd_and_client_ttft():
    rs = [rec(0, 1.0, prompt_n=512, prompt_ms=800.0, predicted_n=1),
          rec(1, 2.2, prompt_n=513, prompt_ms=1000.0, predicted_n=1),
          rec(2, 2.1, error=records.TIMEOUT), rec(3, 3.5, error=records.CANCELLED)]
    row = summarize_prefill(512, rs)
    assert (row.requests_ok, row.requests_failed, row.errors_by_kind) == (2, 1, {"timeout": 1})
    assert (row.prompt_n_min, row.prompt_n_max) == (512, 513)
    assert row.prompt_ms.mean == pytest.approx(900) and row.prompt_ms.sd == pytest.approx(141.42, abs=0.01)
    assert row.prompt_tok_s.mean == pytest.approx((640 + 513) / 2)
    assert row.ttft_ms.mean == pytest.approx(1100)
    assert summarize_prefill(8, [rec(0, 1, prompt_n=8, prompt_ms=10.0)]).prompt_ms.sd is None


def test_depth_change_is_relative_to_depth_zero_and_skips_are_explained():
    rows = [summarize_depth(0, [rec(0, 1, predicted_per_second=50.0, prompt_n=39)]),
            summarize_depth(4096, [rec(0, 1, predicted_per_second=45.0), rec(1, 2, predicted_per_second=47.0)])]
    reason = skip_reason(32768, 64, 8192)
    assert reason == "skipped: prompt 32,768 + n_predict 64 > per-slot n_ctx 8,192"
    rows.append(DepthRow(depth=32768, skipped=reason))
    out = with_change(rows)
    assert out[0].change == 0 and out[0].reference_depth == 0
    assert out[1].change == pytest.approx(46 / 50 - 1)
    assert out[2].change is None and out[2].skipped == reason
    assert skip_reason(1024, 64, 4096) is None and skip_reason(1024, 64, None) is None


def test_depth_reference_is_the_lowest_measured_depth_without_zero():
    out = with_change([summarize_depth(1024, [rec(0, 1, predicted_per_second=40.0)]),
                       summarize_depth(512, [rec(0, 1, predicted_per_second=50.0)])])
    assert [r.reference_depth for r in out] == [512, 512]
    assert out[0].change == pytest.approx(-0.2)


def test_soak_windows_error_free_time_and_drift():
    # 100 s, 10 s windows; 10 tok/s for the first half, 8 tok/s for the second; two errors at 55 s and 57 s.
    rs = [rec(t, t + 0.5, predicted_n=10 if t < 50 else 8) for t in range(100)]
    rs += [rec(54, 55, error=records.CONNECT_ERROR), rec(56, 57, error=records.DISCONNECTED),
           rec(99, 100, error=records.CANCELLED)]
    s = summarize_soak(rs, 0, 100 * S, window_s=10)
    assert len(s.windows) == 10 and s.window_s == 10
    assert s.errors_by_kind == {"connect_error": 1, "disconnected": 1}
    assert (s.requests_ok, s.requests_failed) == (100, 2)
    assert s.error_free_s == pytest.approx(90)
    assert s.longest_error_free_s == pytest.approx(55)
    assert s.drift_windows == 1
    assert s.first_throughput_tok_s == pytest.approx(10) and s.last_throughput_tok_s == pytest.approx(8)
    assert s.drift == pytest.approx(-0.2)
    d = s.to_dict()
    assert d["error_free_hours"] == pytest.approx(90 / 3600) and len(d["windows"]) == 10


def test_soak_drift_significance_needs_two_windows_a_side():
    steady = [rec(t, t + 0.5, predicted_n=10) for t in range(200)]
    s = summarize_soak(steady, 0, 200 * S, window_s=10)
    assert s.drift_windows == 2 and s.drift == pytest.approx(0) and s.drift_significant is False
    short = summarize_soak(steady[:5], 0, 5 * S, window_s=10)
    assert short.drift is None and short.drift_p is None and len(short.windows) == 1


def test_soak_window_length():
    assert window_seconds(6 * 3600) == 60 and window_seconds(20) == 2 and window_seconds(3) == 1


# (good, judged of the first k windows; good, judged of the last k; falling): written before running.
FALLING_CASES = [
    ((90, 100), (90, 100), False),    # the same share: p well above 0.05
    ((100, 100), (50, 100), True),    # halved
    ((95, 100), (90, 100), False),    # lower, but within noise at this count (p ≈ 0.14)
    ((10, 10), (8, 10), False),       # lower, too few requests to tell (p ≈ 0.24)
    ((50, 100), (100, 100), False),   # rising
    ((900, 1000), (850, 1000), True),  # 90% → 85% over a thousand requests a side (p ≈ 0.0005)
    ((0, 0), (5, 10), None),          # the first windows judged nothing
    ((5, 10), (0, 0), None),
]


@pytest.mark.parametrize("first, last, falling", FALLING_CASES)
def test_soak_attainment_is_falling_only_when_lower_beyond_noise(first, last, falling):
    from loadgen.analysis.soak import attainment_falling

    p, verdict = attainment_falling(*first, *last)
    assert verdict is falling
    assert (p is None) == (falling is None)


def test_soak_attainment_and_goodput_per_window_and_overall():
    from loadgen.analysis.slo import parse_slo

    # 100 s, 10 s windows, --slo e2e=1s: the first half all good (0.5 s, 10 tokens); in the second
    # half every odd request took 2 s (due 1.5 s before it left); two failures in window 5, a
    # cancelled request at the end (not judged).
    rs = [rec(t, t + 0.5, predicted_n=10) for t in range(50)]
    rs += [rec(t - 1.5 if t % 2 else t, t + 0.5, predicted_n=8) for t in range(50, 100)]
    rs += [rec(54, 55, error=records.CONNECT_ERROR), rec(56, 57, error=records.DISCONNECTED),
           rec(99, 100, error=records.CANCELLED)]
    s = summarize_soak(rs, 0, 100 * S, window_s=10, slo=parse_slo("e2e=1s"))
    assert [(w.judged, w.good) for w in s.windows] == [(10, 10)] * 5 + [(12, 5)] + [(10, 5)] * 4
    assert s.slo is not None
    assert (s.slo.judged, s.slo.good, s.slo.passed) == (102, 75, False)
    assert s.slo.attainment == pytest.approx(75 / 102)
    assert (s.slo.goodput_req_s, s.slo.goodput_tok_s) == (pytest.approx(0.75), pytest.approx(7.0))
    assert (s.slo.first_attainment, s.slo.last_attainment, s.slo.falling) == (1.0, 0.5, True)
    assert s.slo.falling_p == pytest.approx(3003 / 184756)
    d = s.to_dict()
    assert d["windows"][0] | {"attainment": 1.0, "goodput_req_s": 1.0, "goodput_tok_s": 10.0} == d["windows"][0]
    assert d["slo"]["attainment_change"] == pytest.approx(-0.5) and d["slo"]["falling"] is True
    plain = summarize_soak(rs, 0, 100 * S, window_s=10).to_dict()
    assert "slo" not in plain and "attainment" not in plain["windows"][0]


# (the soak's slo figures, the warning expected): written before running.
SOAK_WARNINGS = [
    (None, []),
    ({"falling": False, "first_attainment": 1.0, "last_attainment": 0.95, "falling_p": 0.3}, []),
    ({"falling": None, "first_attainment": None, "last_attainment": 0.5, "falling_p": None}, []),
    ({"falling": True, "first_attainment": 1.0, "last_attainment": 0.5, "falling_p": 0.016},
     ["t: SLO attainment fell from 100% to 50% between the first and last 1 window(s), more than noise, "
      "Fisher p=0.016"]),
]


@pytest.mark.parametrize("slo, lines", SOAK_WARNINGS)
def test_a_soak_whose_attainment_falls_is_warned_about(slo, lines):
    from loadgen.output.tables import run_lines

    soak = {"duration_s": 100.0, "requests_ok": 10, "requests_failed": 0, "throughput_tok_s": 1.0,
            "error_free_s": 100.0, "longest_error_free_s": 100.0, "drift_windows": 1}
    if slo is not None:
        soak["slo"] = {"required": 0.9, "judged": 10, "good": 9, **slo}
    doc = {"kind": "soak", "targets": [{"label": "t", "soak": soak}]}
    assert [w for w in run_lines(doc).warnings if "attainment" in w] == lines
