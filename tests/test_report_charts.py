"""The interactive charts' data comes from the report's view model (output/report_model.py), pure."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadgen.core.records import ProbeSample
from loadgen.core.rundoc import Level, Server, Target
from loadgen.output import interactive
from loadgen.output.report_model import ProbeTimeline, RunSource, TargetSeries, build_series
from loadgen.results.reader import load_probe, load_records, load_run

FIXTURE = Path(__file__).parent / "data" / "sweep-smollm2"


def fixture_series() -> list[TargetSeries]:
    return build_series([RunSource(FIXTURE.name, load_run(FIXTURE), load_records(FIXTURE), load_probe(FIXTURE))])


# (levels of successive samples, expected (second, level) starts); written before the code ran.
LEVEL_STARTS = [
    ([], []),
    ([1], [(0.0, 1)]),
    ([1, 1, 2, 2, 4], [(0.0, 1), (2.0, 2), (4.0, 4)]),
    ([1, 2, 1], [(0.0, 1), (1.0, 2), (2.0, 1)]),  # a level seen again starts again
]


@pytest.mark.parametrize("levels, starts", LEVEL_STARTS)
def test_level_starts(levels, starts):
    timeline = ProbeTimeline(seconds=[float(i) for i in range(len(levels))], levels=levels,
                             busy_slots=[None] * len(levels), requests_deferred=[None] * len(levels))
    assert timeline.level_starts() == starts


def test_probe_timeline_is_in_time_order_from_the_first_sample():
    samples = [ProbeSample(target="t", level=2, t_ns=3_000_000_000, busy_slots=2),
               ProbeSample(target="t", level=1, t_ns=1_000_000_000, busy_slots=1, requests_deferred=0.0)]
    timeline = TargetSeries(label="t", run_name="r", target={}, probe=samples).probe_timeline()
    assert timeline.seconds == [0.0, 2.0] and timeline.levels == [1, 2]
    assert timeline.busy_slots == [1, 2] and timeline.requests_deferred == [0.0, None]


def test_throughput_chart_plots_run_json_figures_and_the_slots():
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    (series,) = fixture_series()
    fig = interactive.throughput_figure([series])
    (trace,) = fig.data
    assert list(trace.x) == [1, 2]
    assert list(trace.y) == [lv.throughput_tok_s for lv in series.levels]
    assert [shape.x0 for shape in fig.layout.shapes] == [2]  # total_slots


# (levels, slots, whether the axis is log2, the slot label's x); written before the code ran. On a log
# axis a Plotly annotation's x is log10 of the value: given the value, "4 slots" sat at 10^4.
SLOT_LABELS = [([1, 2], 2, False, 2, "2 slots"), ([1, 2, 4, 8], 4, True, math.log10(4), "4 slots"),
               ([1, 4, 16], 1, True, 0.0, "1 slot")]


@pytest.mark.parametrize("levels, slots, log, x, text", SLOT_LABELS)
def test_the_slot_label_sits_on_the_slot_line_on_a_linear_or_log_axis(levels, slots, log, x, text):
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    target = Target(label="t", server=Server(total_slots=slots), levels=[
        Level(level=c, concurrency=c, requests_ok=1, requests_failed=0, output_tokens=c, wall_s=1.0,
              throughput_tok_s=float(c), predicted_ms_mean=None, decode_tok_s_mean=None) for c in levels])
    fig = interactive.throughput_figure([TargetSeries(label="t", run_name="r", target=target)])
    assert (fig.layout.xaxis.type == "log") is log
    assert [shape.x0 for shape in fig.layout.shapes] == [slots]
    (label,) = fig.layout.annotations
    assert label.text == text and label.x == pytest.approx(x)


def test_open_loop_draws_no_slot_line_and_names_the_rate_axis():
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    (series,) = fixture_series()
    series.open_loop = True
    fig = interactive.throughput_figure([series])
    assert not fig.layout.shapes and fig.layout.xaxis.title.text == "offered rate (requests/s)"


def test_every_chart_draws_a_run_with_no_levels():
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    empty = TargetSeries(label="down", run_name="r", target=Target(label="down", levels=[], error="refused"))
    fragments = interactive.render_all([empty])
    assert set(fragments) == set(interactive.CHARTS)
    assert all(f'id="chart-{name}"' in html for name, html in fragments.items())


def test_the_probe_chart_zooms_with_a_range_slider():
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    fig = interactive.probe_figure(fixture_series())
    assert fig.layout.xaxis.rangeslider.visible is True
    assert {trace.name for trace in fig.data} == {"smollm2 busy slots (/slots)", "smollm2 requests_deferred (/metrics)"}


# ---------------------------------------------------------------- a soak's windows
# (window ends in s, window_s, k, first/last means, expected unit, partial flags, drift spans); written before the code ran.
SOAK_TIMELINES = [
    ([1, 2, 3], 1.0, 1, (10.0, 12.0), "s", [False] * 3, [(0, 1, 10.0), (2, 3, 12.0)]),
    ([1, 2, 3, 3.2], 1.0, 1, (10.0, 12.0), "s", [False, False, False, True], [(0, 1, 10.0), (2, 3, 12.0)]),
    ([60 * i for i in range(1, 11)], 60.0, 1, (5.0, 4.0), "s", [False] * 10, [(0, 60, 5.0), (540, 600, 4.0)]),
    ([60 * i for i in range(1, 12)], 60.0, 1, (5.0, 4.0), "min", [False] * 11, [(0, 60, 5.0), (600, 660, 4.0)]),
    ([60 * i for i in range(1, 181)], 60.0, 18, (5.0, 4.0), "min", [False] * 180, [(0, 1080, 5.0), (9720, 10800, 4.0)]),
    ([60 * i for i in range(1, 182)], 60.0, 18, (5.0, 4.0), "h", [False] * 181, [(0, 1080, 5.0), (9780, 10860, 4.0)]),
    ([1], 1.0, 0, (None, None), "s", [False], []),  # too short for a drift
]


@pytest.mark.parametrize("ends, window_s, k, means, unit, partial, spans", SOAK_TIMELINES)
def test_soak_timeline_unit_partial_windows_and_drift_spans(ends, window_s, k, means, unit, partial, spans):
    from loadgen.output.report_model import SoakTimeline

    starts = [0.0] + [float(e) for e in ends[:-1]]
    n = len(ends)
    timeline = SoakTimeline(start_s=starts, end_s=[float(e) for e in ends], throughput_tok_s=[1.0] * n,
                            requests_ok=[1] * n, requests_failed=[0] * n, errors=["none"] * n,
                            latency_ms=[None] * n, ttft_ms=[None] * n, window_s=window_s, drift_windows=k,
                            first_throughput_tok_s=means[0], last_throughput_tok_s=means[1])
    assert timeline.time_unit()[0] == unit
    assert timeline.partial == partial
    assert timeline.drift_spans() == spans
    assert not timeline.has_ttft


def soak_series(failed: list[int]) -> TargetSeries:
    from loadgen.core.rundoc import RunKind, SoakSection, SoakWindow

    ends = [2.0, 4.0, 4.5][:len(failed)]
    windows = [SoakWindow(start_s=e - 2.0 if e != 4.5 else 4.0, end_s=e, requests_ok=10, requests_failed=f,
                          errors_by_kind={"http_500": f} if f else {}, output_tokens=100, throughput_tok_s=50.0 + k)
               for k, (e, f) in enumerate(zip(ends, failed))]
    soak = SoakSection(duration_s=ends[-1], requests_ok=30, requests_failed=sum(failed), throughput_tok_s=50.0,
                       error_free_s=0.0, longest_error_free_s=0.0, first_throughput_tok_s=50.0,
                       last_throughput_tok_s=51.0, drift_windows=1, window_s=2.0, windows=windows)
    return TargetSeries(label="s", run_name="r", target=Target(label="s", soak=soak), kind=RunKind.SOAK)


# (failed requests per window, expected marker symbols, whether failure bars and a second axis are drawn);
# written before the code ran. The 0.5 s window the soak's end cut is hollow.
SOAK_FIGURES = [
    ([0, 0, 0], ["circle", "circle", "circle-open"], False),
    ([0, 3, 1], ["circle", "circle", "circle-open"], True),
    ([0, 0], ["circle", "circle"], False),
]


@pytest.mark.parametrize("failed, symbols, bars", SOAK_FIGURES)
def test_soak_throughput_chart_marks_the_cut_window_and_draws_failures_only_when_there_are_some(failed, symbols, bars):
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    fig = interactive.soak_throughput_figure([soak_series(failed)])
    line = fig.data[0]
    assert list(line.marker.symbol) == symbols and list(line.y) == [50.0 + k for k in range(len(failed))]
    drift = [t for t in fig.data if "window(s) mean" in t.name]
    assert [(list(t.x), list(t.y)) for t in drift] == [([0.0, 2.0], [50.0, 50.0]), ([2.0, 4.0], [51.0, 51.0])]
    assert any(t.type == "bar" for t in fig.data) is bars
    assert (fig.to_dict()["layout"].get("yaxis2", {}).get("title", {}).get("text") == "failed requests") is bars
    assert fig.layout.xaxis.rangeslider.visible is True


# A capacity search's probe order -> the charts' x order; a level run twice keeps both runs, side by
# side in the order they ran. Written before the code ran.
PROBE_ORDERS = [
    ([1, 2, 4, 8, 6, 5], [1, 2, 4, 5, 6, 8]),
    ([1, 2, 4, 2], [1, 2, 2, 4]),
    ([0.5, 2.0, 1.0], [0.5, 1.0, 2.0]),  # request rates
    ([], []),
]


@pytest.mark.parametrize("probed, drawn", PROBE_ORDERS)
def test_charts_draw_levels_by_value_not_probe_order(probed, drawn):
    import msgspec

    (series,) = fixture_series()
    base = series.levels[0]
    levels = [msgspec.structs.replace(base, level=v, throughput_tok_s=float(k)) for k, v in enumerate(probed)]
    series.target = msgspec.structs.replace(series.target, levels=levels)
    assert [lv.level for lv in series.levels] == probed  # the tables keep the order they ran
    assert [lv.level for lv in series.chart_levels] == drawn
    runs = [lv.throughput_tok_s for lv in series.chart_levels]  # a repeated level: its runs in the order they ran
    assert runs == sorted(runs, key=lambda k: (probed[int(k)], k))
    if not probed:
        return
    pytest.importorskip("plotly", reason="the interactive charts need the report extra (plotly)")
    (trace,) = interactive.throughput_figure([series]).data
    assert list(trace.x) == drawn and list(trace.y) == runs
    from loadgen.output import charts
    line = charts.throughput_figure([series]).axes[0].lines[0]
    assert list(line.get_xdata()) == drawn and list(line.get_ydata()) == runs
