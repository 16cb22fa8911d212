"""The report's interactive charts, drawn with Plotly: values on hover, series toggled by a click on
the legend, zoom by dragging (a range slider under the probe's time series).

Each chart function takes the report's `TargetSeries` (the view model, `report_model.py`) and returns
a `plotly.graph_objects.Figure`; `render_all` turns them into HTML fragments (a <div> and the
<script> that draws it) keyed by report section, and `plotly_js` is the plotly.js bundle that
`html.py` inlines once into the page's <head>, so the file fetches nothing. A series keeps the
colour it has in the PNG charts (`charts.COLOURS`, repeated here so matplotlib is not loaded).

Plotly is the optional extra `loadgen[report]`; `available()` says whether it is installed, and
without it the report falls back to the PNG charts.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.records import level_short
from .report_model import (
    attainment_points,
    energy_points,
    has_energy,
    has_slo,
    has_soak_slo,
    level_extras,
    percentile_curve,
)

if TYPE_CHECKING:
    from plotly.graph_objects import Figure

    from .report_model import TargetSeries

COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]
PERCENTILE_TICKS = [(0.0, "0%"), (0.9, "90%"), (0.99, "99%"), (0.999, "99.9%"), (0.9999, "99.99%")]
# No logo and no "Share chart..." button (plotly.py turns it on: it uploads the chart to Plotly Cloud);
# nothing on the page points off the file. The PNG download, zoom and pan stay.
CONFIG = {"displaylogo": False, "showSendToCloud": False, "responsive": True}


def available() -> bool:
    """Whether plotly is installed (the `report` extra)."""
    return importlib.util.find_spec("plotly") is not None


def colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _go() -> Any:
    import plotly.graph_objects as go  # loaded only when a report is drawn

    return go


def _x_title(series: Sequence[TargetSeries]) -> str:
    return ("offered rate (requests/s)" if any(s.open_loop for s in series)
            else "concurrency (requests in flight)")


def _level_axis(series: Sequence[TargetSeries]) -> dict[str, Any]:
    """An x-axis with a tick at every level; log2 when the levels span 8× or more."""
    levels = sorted({lv.level for s in series for lv in s.chart_levels})
    log2 = {"type": "log"} if levels and levels[-1] / max(levels[0], 1) >= 8 else {}
    return {"title": _x_title(series), "tickvals": levels, "ticktext": [str(c) for c in levels], **log2}


# Under the plot; beside it where a range slider takes the space below (there it would be cut off).
LEGEND_BELOW = {"orientation": "h", "y": -0.25}
LEGEND_BESIDE = {"orientation": "v", "x": 1.02, "y": 1}


def _layout(fig: Figure, title: str, height: int = 420, slider: bool = False, **axes: Any) -> Figure:
    """slider: the x-axis has a range slider (the legend goes beside the plot)."""
    fig.update_layout(title=title, height=height, template="plotly_white", hovermode="closest",
                      legend=LEGEND_BESIDE if slider else LEGEND_BELOW, margin={"t": 50, "b": 40}, **axes)
    return fig


def throughput_figure(series: Sequence[TargetSeries]) -> Figure:
    """Throughput (generated tok/s) per level, one line per series; the slot count as a dotted line."""
    go = _go()
    fig = go.Figure()
    open_loop = any(s.open_loop for s in series)
    axis = _level_axis(series)
    for i, s in enumerate(series):
        fig.add_trace(go.Scatter(
            x=[lv.level for lv in s.chart_levels], y=[lv.throughput_tok_s or 0.0 for lv in s.chart_levels],
            mode="lines+markers", name=s.label, line={"color": colour(i)},
            hovertemplate="%{x}: %{y:.2f} tok/s<extra>%{fullData.name}</extra>"))
        if s.total_slots and not open_loop:  # slots are a concurrency, not a rate
            fig.add_vline(x=s.total_slots, line={"color": colour(i), "dash": "dot"})
            # An annotation's x on a log axis is the log10 of the value (a shape's is the value itself).
            log = "type" in axis  # _level_axis sets a type only for a log axis
            fig.add_annotation(x=math.log10(s.total_slots) if log else s.total_slots, y=1, yref="paper",
                               text=f"{s.total_slots} slot{'s' * (s.total_slots != 1)}", showarrow=False, xanchor="left", yanchor="bottom",
                               font={"color": colour(i), "size": 11})
    return _layout(fig, "Throughput vs offered rate" if open_loop else "Throughput vs concurrency",
                   xaxis=axis, yaxis={"title": "throughput (generated tok/s)", "rangemode": "tozero"})


def latency_figure(series: Sequence[TargetSeries]) -> Figure:
    """Latency p50 (solid) and p99 (dashed) per level, and the mean queue wait (dotted)."""
    go = _go()
    fig = go.Figure()
    for i, s in enumerate(series):
        levels = [lv for lv in s.chart_levels if lv.latency_ms]
        xs = [lv.level for lv in levels]
        for stat, dash in (("p50", "solid"), ("p99", "dash")):
            fig.add_trace(go.Scatter(
                x=xs, y=[getattr(lv.latency_ms, stat) for lv in levels], mode="lines+markers", name=f"{s.label} {stat}",
                line={"color": colour(i), "dash": dash},
                hovertemplate=f"%{{x}}: {stat} %{{y:.1f}} ms<extra>%{{fullData.name}}</extra>"))
        fig.add_trace(go.Scatter(
            x=xs, y=[(lv.queue_wait_ms.mean if lv.queue_wait_ms else None) or 0.0 for lv in levels], mode="lines+markers",
            name=f"{s.label} queue wait mean", line={"color": colour(i), "dash": "dot"}, marker={"symbol": "square"},
            hovertemplate="%{x}: queue wait %{y:.1f} ms<extra>%{fullData.name}</extra>"))
    return _layout(fig, "Latency vs concurrency", xaxis=_level_axis(series),
                   yaxis={"title": "latency (ms)", "rangemode": "tozero"})


def percentile_figure(series: Sequence[TargetSeries]) -> Figure:
    """Latency by percentile (HdrHistogram curve) per series and level, log x-axis of 1/(1-p)."""
    go = _go()
    fig = go.Figure()
    dashes = ["solid", "dash", "dashdot", "dot"]
    for i, s in enumerate(series):
        for k, lv in enumerate(s.chart_levels):
            values = s.latencies_ms(lv.level)
            if not values:
                continue
            xs, ys = percentile_curve(values)
            fig.add_trace(go.Scatter(
                x=xs, y=ys, customdata=100 * (1 - 1 / xs), mode="lines",
                name=f"{s.label} {level_short(lv.level, lv.rate is not None)}",
                line={"color": colour(i), "dash": dashes[k % len(dashes)]},
                hovertemplate="p%{customdata:.2f}: %{y:.1f} ms<extra>%{fullData.name}</extra>"))
    return _layout(fig, "Latency by percentile distribution",
                   xaxis={"title": "percentile", "type": "log", "tickvals": [1 / (1 - p) for p, _ in PERCENTILE_TICKS],
                          "ticktext": [name for _, name in PERCENTILE_TICKS]},
                   yaxis={"title": "latency (ms)", "rangemode": "tozero"})


def probe_figure(series: Sequence[TargetSeries]) -> Figure:
    """Busy slots and requests_deferred over time, per series, level starts dotted; a range slider zooms."""
    go = _go()
    fig = go.Figure()
    for i, s in enumerate(series):
        timeline = s.probe_timeline()
        if not timeline.seconds:
            continue
        fig.add_trace(go.Scatter(
            x=timeline.seconds, y=timeline.busy_slots, mode="lines", line={"shape": "hv", "color": colour(i)},
            name=f"{s.label} busy slots (/slots)", customdata=timeline.levels,
            hovertemplate="%{x:.1f} s (level %{customdata}): %{y} busy<extra>%{fullData.name}</extra>"))
        fig.add_trace(go.Scatter(
            x=timeline.seconds, y=timeline.requests_deferred, mode="lines",
            line={"shape": "hv", "color": colour(i), "dash": "dash"},
            name=f"{s.label} requests_deferred (/metrics)", customdata=timeline.levels,
            hovertemplate="%{x:.1f} s (level %{customdata}): %{y} deferred<extra>%{fullData.name}</extra>"))
        if len(series) == 1:  # with several runs the level marks of each would overlap
            for t, level in timeline.level_starts():
                fig.add_vline(x=t, line={"color": "#999", "dash": "dot", "width": 1},
                              annotation_text=f"c={level}", annotation_font_size=10)
    return _layout(fig, "Server queue over time", height=460, slider=True,
                   xaxis={"title": "time since the first sample (s)", "rangeslider": {"visible": True}},
                   yaxis={"title": "requests", "rangemode": "tozero"})


def decode_figure(series: Sequence[TargetSeries]) -> Figure:
    """Box plots with every point of per-request decode tok/s, grouped by level, one colour per series."""
    go = _go()
    fig = go.Figure()
    for i, s in enumerate(series):
        xs: list[str] = []
        ys: list[float] = []
        for lv in s.chart_levels:
            values = s.decode_speeds(lv.level)
            xs += [str(lv.level)] * len(values)
            ys += values
        if ys:
            fig.add_trace(go.Box(x=xs, y=ys, name=s.label, boxpoints="all", jitter=0.4, pointpos=0,
                                 marker={"color": colour(i), "size": 4}, line={"color": colour(i)},
                                 hovertemplate="%{x}: %{y:.1f} tok/s<extra>%{fullData.name}</extra>"))
    fig.update_layout(boxmode="group")
    return _layout(fig, "Per-request decode speed (timings.predicted_per_second)",
                   xaxis={"title": _x_title(series), "type": "category"},
                   yaxis={"title": "decode speed per request (tok/s)", "rangemode": "tozero"})


def _soak_time_axis(series: Sequence[TargetSeries]) -> dict[str, Any]:
    units = {s.soak_timeline().time_unit()[0] for s in series}
    unit = units.pop() if len(units) == 1 else "s"
    return {"title": f"time since the soak's start ({unit})", "rangeslider": {"visible": True}}


def _window_times(s: TargetSeries, several_units: bool) -> tuple[list[float], list[float], list[float], str]:
    """A series' window middles, starts and ends in the report's time unit (seconds when the
    series' soaks read best in different units), and that unit."""
    t = s.soak_timeline()
    if several_units:
        return t.middle_s, t.start_s, t.end_s, "s"
    return t.in_unit(t.middle_s), t.in_unit(t.start_s), t.in_unit(t.end_s), t.time_unit()[0]


def _several_units(series: Sequence[TargetSeries]) -> bool:
    return len({s.soak_timeline().time_unit() for s in series}) > 1


def soak_throughput_figure(series: Sequence[TargetSeries]) -> Figure:
    """Each window's throughput (at the window's middle), the first and last k windows' means that the
    drift compares as dashed segments, and failed requests per window as bars on a second axis."""
    go = _go()
    fig = go.Figure()
    failures = 0
    several = _several_units(series)
    for i, s in enumerate(series):
        t = s.soak_timeline()
        middle, start, end, unit = _window_times(s, several)
        partial = [" (a partial window)" if p else "" for p in t.partial]
        custom = list(zip(start, end, t.requests_ok, t.requests_failed, t.errors, partial))
        fig.add_trace(go.Scatter(
            x=middle, y=t.throughput_tok_s, customdata=custom, mode="lines+markers", name=s.label,
            line={"color": colour(i)}, marker={"symbol": ["circle-open" if p else "circle" for p in t.partial],
                                               "size": 7},
            hovertemplate=f"%{{customdata[0]:.1f}}–%{{customdata[1]:.1f}} {unit}: %{{y:.2f}} tok/s%{{customdata[5]}}<br>"
                          "ok %{customdata[2]}, failed %{customdata[3]} (%{customdata[4]})<extra>%{fullData.name}</extra>"))
        scale = 1.0 if several else t.time_unit()[1]
        for (a, b, mean), which in zip(t.drift_spans(), ("first", "last")):
            fig.add_trace(go.Scatter(
                x=[a / scale, b / scale], y=[mean, mean], mode="lines", name=f"{s.label} {which} {t.drift_windows} window(s) mean",
                line={"color": colour(i), "dash": "dash", "width": 3}, legendgroup=f"drift{i}",
                hovertemplate=f"{which} windows' mean: %{{y:.2f}} tok/s<extra>%{{fullData.name}}</extra>"))
        if any(t.requests_failed):
            failures = max(failures, *t.requests_failed)
            fig.add_trace(go.Bar(
                x=middle, y=t.requests_failed, customdata=custom, name=f"{s.label} failed requests", yaxis="y2",
                marker={"color": colour(i), "opacity": 0.35},
                hovertemplate=f"%{{customdata[0]:.1f}}–%{{customdata[1]:.1f}} {unit}: %{{y}} failed (%{{customdata[4]}})"
                              "<extra>%{fullData.name}</extra>"))
    second = {"yaxis2": {"title": "failed requests", "overlaying": "y", "side": "right", "rangemode": "tozero",
                         "showgrid": False, "tick0": 0, "dtick": max(1, math.ceil(failures / 5))}} if failures else {}
    _layout(fig, "Throughput per window", height=460, slider=True, xaxis=_soak_time_axis(series),
            yaxis={"title": "throughput (generated tok/s)", "rangemode": "tozero"}, **second)
    if failures:  # the legend clear of the second axis' ticks and title
        fig.update_layout(legend={"x": 1.08})
    return fig


def soak_latency_figure(series: Sequence[TargetSeries]) -> Figure:
    """Each window's latency p50 (solid) and p99 (dashed), and TTFT p50/p99 (dotted) when it streamed."""
    go = _go()
    fig = go.Figure()
    several = _several_units(series)
    for i, s in enumerate(series):
        t = s.soak_timeline()
        middle, start, end, unit = _window_times(s, several)
        metrics = [("latency_ms", "latency", ("solid", "dash"))]
        if t.has_ttft:
            metrics.append(("ttft_ms", "TTFT", ("dot", "dashdot")))
        for metric, name, dashes in metrics:
            for stat, dash in zip(("p50", "p99"), dashes):
                fig.add_trace(go.Scatter(
                    x=middle, y=t.stat(stat, metric), customdata=list(zip(start, end)),
                    mode="lines+markers", name=f"{s.label} {name} {stat}", line={"color": colour(i), "dash": dash},
                    hovertemplate=f"%{{customdata[0]:.1f}}–%{{customdata[1]:.1f}} {unit}: {name} {stat} %{{y:.1f}} ms"
                                  "<extra>%{fullData.name}</extra>"))
    return _layout(fig, "Latency per window", height=460, slider=True, xaxis=_soak_time_axis(series),
                   yaxis={"title": "ms (requests completed in the window)", "rangemode": "tozero"})


CHARTS = {
    "throughput": throughput_figure,
    "latency": latency_figure,
    "percentiles": percentile_figure,
    "probe": probe_figure,
    "decode": decode_figure,
}
def soak_attainment_figure(series: Sequence[TargetSeries]) -> Figure:
    """Each window's attainment in % (--slo) over the soak, and the required attainment dashed."""
    go = _go()
    fig = go.Figure()
    several = _several_units(series)
    required: set[float] = set()
    for i, s in enumerate(series):
        t = s.soak_timeline()
        if t.required_attainment is None:
            continue
        required.add(100 * t.required_attainment)
        middle, start, end, unit = _window_times(s, several)
        fig.add_trace(go.Scatter(
            x=middle, y=[None if a is None else 100 * a for a in t.attainment], customdata=list(zip(start, end)),
            mode="lines+markers", name=s.label, line={"color": colour(i)},
            hovertemplate=f"%{{customdata[0]:.1f}}–%{{customdata[1]:.1f}} {unit}: attainment %{{y:.1f}}%"
                          "<extra>%{fullData.name}</extra>"))
    for needed in sorted(required):
        fig.add_hline(y=needed, line={"color": "grey", "dash": "dash", "width": 1},
                      annotation_text=f"--attainment {needed:g}%")
    return _layout(fig, "SLO attainment per window", height=420, slider=True, xaxis=_soak_time_axis(series),
                   yaxis={"title": "% of requests meeting every target", "range": [0, 105]})


def speculation_figure(series: Sequence[TargetSeries]) -> Figure:
    """Per level, draft acceptance (solid) and reasoning share (dashed), in %, for the series that have them."""
    go = _go()
    fig = go.Figure()
    for i, s in enumerate(series):
        xs = [lv.level for lv in s.chart_levels]
        for field, name, dash, symbol in (("acceptance", "draft acceptance", "solid", "circle"),
                                          ("reasoning_share", "reasoning share", "dash", "square")):
            ys = [None if getattr(lv, field) is None else 100 * getattr(lv, field) for lv in s.chart_levels]
            if any(y is not None for y in ys):
                fig.add_trace(go.Scatter(
                    x=xs, y=ys, mode="lines+markers", name=f"{s.label} {name}", line={"color": colour(i), "dash": dash},
                    marker={"symbol": symbol}, hovertemplate=f"%{{x}}: {name} %{{y:.1f}}%<extra>%{{fullData.name}}</extra>"))
    return _layout(fig, "Speculation and reasoning per level", xaxis=_level_axis(series),
                   yaxis={"title": "% of drafted / of output tokens", "range": [0, 105]})


def energy_figure(series: Sequence[TargetSeries]) -> Figure:
    """J per output token per level, gross (solid) and net of idle power (dashed), on the left axis;
    mean power (dotted) on the right; a level during which the machine changed gets a red ×."""
    go = _go()
    fig = go.Figure()
    for i, s in enumerate(series):
        p = energy_points(s)
        for ys, name, dash, unit, axis in ((p.j_per_token, "J/token", "solid", "J/token", "y"),
                                           (p.net_j_per_token, "net J/token", "dash", "J/token", "y"),
                                           (p.mean_w, "mean W", "dot", "W", "y2")):
            if any(y is not None for y in ys):
                fig.add_trace(go.Scatter(
                    x=p.levels, y=ys, mode="lines+markers", name=f"{s.label} {name}", yaxis=axis,
                    line={"color": colour(i), "dash": dash},
                    hovertemplate=f"%{{x}}: %{{y:.4g}} {unit}<extra>%{{fullData.name}}</extra>"))
        marked = [(x, y) for x, y, c in zip(p.levels, p.j_per_token, p.changed) if c and y is not None]
        if marked:
            fig.add_trace(go.Scatter(
                x=[x for x, _ in marked], y=[y for _, y in marked], mode="markers", name=f"{s.label} machine changed",
                marker={"symbol": "x", "size": 12, "color": "#c0392b"},
                hovertemplate="%{x}: the machine changed during this level<extra>%{fullData.name}</extra>"))
    return _layout(fig, "Energy per level", xaxis=_level_axis(series),
                   yaxis={"title": "J per output token", "rangemode": "tozero"},
                   yaxis2={"title": "mean power (W)", "overlaying": "y", "side": "right", "rangemode": "tozero"})


def slo_figure(series: Sequence[TargetSeries]) -> Figure:
    """Per level, the attainment in % of each series judged against an SLO, and the required
    attainment (--attainment) as a dashed line."""
    go = _go()
    fig = go.Figure()
    required: set[float] = set()
    for i, s in enumerate(series):
        xs, ys, needed = attainment_points(s)
        if xs:
            fig.add_trace(go.Scatter(
                x=xs, y=ys, mode="lines+markers", name=s.label, line={"color": colour(i)},
                hovertemplate="%{x}: attainment %{y:.1f}%<extra>%{fullData.name}</extra>"))
        if needed is not None:
            required.add(needed)
    for needed in sorted(required):
        fig.add_hline(y=needed, line={"color": "grey", "dash": "dash", "width": 1},
                      annotation_text=f"--attainment {needed:g}%")
    return _layout(fig, "SLO attainment per level", xaxis=_level_axis(series),
                   yaxis={"title": "% of requests meeting every target", "range": [0, 105]})


def charts_for(series: Sequence[TargetSeries], soak: bool = False) -> dict[str, Any]:
    """The charts of a report: a soak's, or a sweep's with the attainment chart when a level was
    judged against an SLO, the speculation chart and the energy chart when they have something to draw."""
    if soak:
        return SOAK_CHARTS | ({"attainment-over-time": soak_attainment_figure} if has_soak_slo(series) else {})
    return (CHARTS | ({"slo": slo_figure} if has_slo(series) else {})
            | ({"speculation": speculation_figure} if any(level_extras(series)) else {})
            | ({"energy": energy_figure} if has_energy(series) else {}))


SOAK_CHARTS = {
    "throughput-over-time": soak_throughput_figure,
    "latency-over-time": soak_latency_figure,
    "probe": probe_figure,
}


def render_all(series: Sequence[TargetSeries], soak: bool = False) -> dict[str, str]:
    """Every chart (a soak's with `soak`) as an HTML fragment (<div> and its <script>, no plotly.js),
    keyed by section id."""
    return {name: draw(series).to_html(full_html=False, include_plotlyjs=False, config=CONFIG,
                                       div_id=f"chart-{name}")
            for name, draw in charts_for(series, soak).items()}


def plotly_js() -> str:
    """The plotly.js bundle that ships with the plotly package, to inline in the page."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()
