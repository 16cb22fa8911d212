"""The report's figures, drawn with matplotlib's Agg canvas (no pyplot, no display, no global state).

Each chart function takes the report's `TargetSeries` and returns a Figure; `render_all` turns
them into PNG bytes keyed by report section. A series keeps one colour in every chart. Figures
only read numbers that run.json, the records and the probe samples already hold, or derive them
with `metrics` (latency per request, HdrHistogram percentiles).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from ..analysis import metrics
from ..core.records import level_short
from ..core.rundoc import Level
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
    from .report_model import TargetSeries

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]
DPI = 100
WIDTH_IN = 10.5
PERCENTILE_TICKS = [(0.0, "0%"), (0.9, "90%"), (0.99, "99%"), (0.999, "99.9%"), (0.9999, "99.99%")]


def colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _figure(height_in: float, rows: int = 1, **grid) -> tuple[Figure, list]:
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, squeeze=False, **grid)[:, 0]
    return fig, list(axes)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666")


def _open_loop(series: Sequence[TargetSeries]) -> bool:
    return any(s.open_loop for s in series)


def _x_label(series: Sequence[TargetSeries]) -> str:
    return "offered rate (requests/s)" if _open_loop(series) else "concurrency (requests in flight)"


def _short(lv: Level) -> str:
    return level_short(lv.level, lv.rate is not None)


def _concurrency_axis(ax, series: Sequence[TargetSeries]) -> None:
    levels = sorted({lv.level for s in series for lv in s.chart_levels})
    if levels and levels[-1] / max(levels[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(levels or [1]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(c) for c in levels or [1]])
    ax.set_xlabel(_x_label(series))
    ax.grid(True, alpha=0.3)


def throughput_figure(series: Sequence[TargetSeries]) -> Figure:
    """Throughput (tok/s) vs concurrency, one line per series, the slot count as a dotted line."""
    fig, (ax,) = _figure(4.5)
    for i, s in enumerate(series):
        xs = [lv.level for lv in s.chart_levels]
        ys = [lv.throughput_tok_s or 0.0 for lv in s.chart_levels]
        ax.plot(xs, ys, marker="o", color=colour(i), label=s.label)
        if s.total_slots and not _open_loop(series):  # slots are a concurrency, not a rate
            ax.axvline(s.total_slots, color=colour(i), linestyle=":", linewidth=1.5,
                       label=f"{s.label}: {s.total_slots} slots")
    _concurrency_axis(ax, series)
    ax.set_ylabel("throughput (generated tok/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs offered rate" if _open_loop(series) else "Throughput vs concurrency")
    if series:
        ax.legend(fontsize="small")
    else:
        _empty(ax, "no levels")
    return fig


def latency_figure(series: Sequence[TargetSeries]) -> Figure:
    """p50/p99 lines on top; below, stacked bars of mean server work and mean queue wait per level."""
    fig, (top, bottom) = _figure(7.5, rows=2)
    levels = sorted({lv.level for s in series for lv in s.chart_levels})
    slot = {c: k for k, c in enumerate(levels)}
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        xs = [lv.level for lv in s.chart_levels if lv.latency_ms]
        top.plot(xs, [lv.latency_ms.p50 for lv in s.chart_levels if lv.latency_ms], marker="o",
                 color=colour(i), label=f"{s.label} p50")
        top.plot(xs, [lv.latency_ms.p99 for lv in s.chart_levels if lv.latency_ms], marker="^",
                 linestyle="--", color=colour(i), label=f"{s.label} p99")
        positions, service, waiting = [], [], []
        for lv in s.chart_levels:
            if not lv.latency_ms:
                continue
            wait = lv.queue_wait_ms.mean if lv.queue_wait_ms else 0.0
            positions.append(slot[lv.level] - 0.4 + width * (i + 0.5))
            waiting.append(wait)
            service.append(max(lv.latency_ms.mean - wait, 0.0))
        bottom.bar(positions, service, width=width * 0.9, color=colour(i), label=f"{s.label}: server work")
        bottom.bar(positions, waiting, width=width * 0.9, bottom=service, color=colour(i), alpha=0.35,
                   hatch="//", edgecolor=colour(i), label=f"{s.label}: queue wait")
        for x, sv, w in zip(positions, service, waiting):
            if sv + w > 0:
                bottom.annotate(f"{w / (sv + w):.0%}", (x, sv + w), ha="center", va="bottom", fontsize="x-small")
    _concurrency_axis(top, series)
    top.set_ylabel("latency (ms)")
    top.set_ylim(bottom=0)
    top.set_title("Latency percentiles vs offered rate" if _open_loop(series) else "Latency percentiles vs concurrency")
    bottom.set_xticks(range(len(levels)), [str(c) for c in levels])
    bottom.set_xlabel(_x_label(series))
    bottom.set_ylabel("mean latency (ms)")
    bottom.set_title("Mean latency: server work (prompt + decode) and queue wait (share labelled)")
    bottom.grid(True, axis="y", alpha=0.3)
    if levels:
        top.legend(fontsize="small", ncol=2)
        bottom.legend(fontsize="small", ncol=2)
    else:
        _empty(top, "no levels")
    return fig


def percentile_figure(series: Sequence[TargetSeries]) -> Figure:
    """Latency by percentile, log x-axis of 1/(1-p), one curve per series and level."""
    fig, (ax,) = _figure(5.0)
    styles = ["-", "--", "-.", ":"]
    drawn = 0
    for i, s in enumerate(series):
        for k, lv in enumerate(s.chart_levels):
            values = [metrics.latency_ms(r) for r in s.records if r.level == lv.level and r.ok]
            if not values:
                continue
            xs, ys = percentile_curve(values)
            ax.plot(xs, ys, color=colour(i), linestyle=styles[k % len(styles)],
                    alpha=1.0 - 0.5 * k / max(len(s.chart_levels), 1), label=f"{s.label} {_short(lv)}")
            drawn += 1
    ax.set_xscale("log")
    ax.set_xlim(1, 1e4)
    ax.xaxis.set_major_locator(FixedLocator([1 / (1 - p) for p, _ in PERCENTILE_TICKS]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([name for _, name in PERCENTILE_TICKS])
    ax.set_xlabel("percentile")
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("Latency by percentile distribution")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize="small", ncol=2)
    else:
        _empty(ax, "no successful requests")
    return fig


def probe_figure(series: Sequence[TargetSeries]) -> Figure:
    """requests_deferred and busy slots over time, one panel per series, level boundaries dotted."""
    fig, axes = _figure(2.6 * max(len(series), 1) + 0.6, rows=max(len(series), 1), sharex=False)
    if not series:
        _empty(axes[0], "no targets")
    for ax, (i, s) in zip(axes, enumerate(series)):
        samples = sorted(s.probe, key=lambda p: p.t_ns)
        ax.set_title(s.label, fontsize="medium")
        ax.set_ylabel("requests")
        ax.set_xlabel("time since the first sample (s)")
        ax.grid(True, alpha=0.3)
        if not samples:
            _empty(ax, "no probe samples (server metrics or slots endpoint off)")
            continue
        t0 = samples[0].t_ns
        ts = [(p.t_ns - t0) / 1e9 for p in samples]
        deferred = [np.nan if p.requests_deferred is None else p.requests_deferred for p in samples]
        busy = [np.nan if p.busy_slots is None else p.busy_slots for p in samples]
        ax.step(ts, busy, where="post", color=colour(i), label="busy slots (/slots)")
        ax.step(ts, deferred, where="post", color="#D55E00" if colour(i) != "#D55E00" else "#000000",
                linestyle="--", label="requests_deferred (/metrics)")
        if s.total_slots:
            ax.axhline(s.total_slots, color="#777", linewidth=0.8, linestyle="-.", label=f"{s.total_slots} slots")
        previous = None
        for p, t in zip(samples, ts):
            if p.level != previous:
                ax.axvline(t, color="#999", linestyle=":", linewidth=1)
                ax.annotate(f"c={p.level}", (t, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                            textcoords="offset points", fontsize="x-small", color="#444")
                previous = p.level
        ax.set_ylim(bottom=0)
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def decode_figure(series: Sequence[TargetSeries]) -> Figure:
    """Box plots (with the points) of per-request decode tok/s, grouped by level, one colour per series."""
    fig, (ax,) = _figure(4.5)
    levels = sorted({lv.level for s in series for lv in s.chart_levels})
    slot = {c: k for k, c in enumerate(levels)}
    width = 0.8 / max(len(series), 1)
    rng = np.random.default_rng(0)  # fixed jitter: the same data draws the same picture
    drawn = 0
    for i, s in enumerate(series):
        for lv in s.chart_levels:
            values = [v for r in s.records if r.level == lv.level
                      and (v := metrics.decode_tok_s(r)) is not None]
            if not values:
                continue
            x = slot[lv.level] - 0.4 + width * (i + 0.5)
            ax.boxplot([values], positions=[x], widths=width * 0.7, showfliers=False, patch_artist=True,
                       boxprops={"facecolor": colour(i), "alpha": 0.3, "edgecolor": colour(i)},
                       medianprops={"color": colour(i)}, whiskerprops={"color": colour(i)},
                       capprops={"color": colour(i)})
            ax.scatter(x + rng.uniform(-width * 0.25, width * 0.25, len(values)), values, s=10,
                       color=colour(i), label=s.label if drawn == 0 or lv is s.chart_levels[0] else None, zorder=3)
            drawn += 1
    ax.set_xticks(range(len(levels)), [str(c) for c in levels])
    ax.set_xlim(-0.6, max(len(levels), 1) - 0.4)
    ax.set_xlabel(_x_label(series))
    ax.set_ylabel("decode speed per request (tok/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Per-request decode speed (timings.predicted_per_second)")
    ax.grid(True, axis="y", alpha=0.3)
    if drawn:
        ax.legend(fontsize="small")
    else:
        _empty(ax, "no decode timings")
    return fig


def _soak_scale(series: Sequence[TargetSeries]) -> tuple[str, float]:
    """The soaks' time unit and its seconds: the one they share, else seconds."""
    units = {s.soak_timeline().time_unit() for s in series}
    return units.pop() if len(units) == 1 else ("s", 1.0)


def soak_throughput_figure(series: Sequence[TargetSeries]) -> Figure:
    """Window throughput over the soak, the drift's first/last window means dashed, failures as bars."""
    fig, (ax,) = _figure(4.5)
    bars = None
    drawn = 0
    unit, scale = _soak_scale(series)
    for i, s in enumerate(series):
        t = s.soak_timeline()
        if not t.start_s:
            continue
        middle = [x / scale for x in t.middle_s]
        ax.plot(middle, t.throughput_tok_s, marker="o", markersize=3, color=colour(i), label=s.label)
        cut = [k for k, p in enumerate(t.partial) if p]  # the short last window: hollow, its rate is noisy
        ax.scatter([middle[k] for k in cut], [t.throughput_tok_s[k] for k in cut], s=30, facecolors="white",
                   edgecolors=colour(i), zorder=3)
        for (a, b, mean), which in zip(t.drift_spans(), ("first", "last")):
            ax.hlines(mean, a / scale, b / scale, colors=colour(i), linestyles="--", linewidth=2.5,
                      label=f"{s.label}: {which} {t.drift_windows} window(s) mean")
        if any(t.requests_failed):
            bars = bars or ax.twinx()
            bars.bar(middle, t.requests_failed, width=[(b - a) / scale for a, b in zip(t.start_s, t.end_s)],
                     color=colour(i), alpha=0.3, label=f"{s.label}: failed requests")
        drawn += 1
    ax.set_xlabel(f"time since the soak's start ({unit})")
    ax.set_ylabel("throughput (generated tok/s)")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput per window")
    ax.grid(True, alpha=0.3)
    if bars is not None:
        bars.set_ylabel("failed requests")
        bars.set_ylim(bottom=0)
        bars.legend(fontsize="small", loc="lower right")
    if drawn:
        ax.legend(fontsize="small", loc="lower left")
    else:
        _empty(ax, "no windows")
    return fig


def soak_latency_figure(series: Sequence[TargetSeries]) -> Figure:
    """Window latency p50/p99 over the soak, and TTFT p50/p99 when it streamed."""
    fig, (ax,) = _figure(4.5)
    drawn = 0
    unit, scale = _soak_scale(series)
    for i, s in enumerate(series):
        t = s.soak_timeline()
        middle = [x / scale for x in t.middle_s]
        metrics_drawn = [("latency_ms", "latency", ("-", "--"))] + ([("ttft_ms", "TTFT", (":", "-."))] if t.has_ttft else [])
        for metric, name, styles in metrics_drawn:
            for stat, style in zip(("p50", "p99"), styles):
                ys = [np.nan if v is None else v for v in t.stat(stat, metric)]
                if not np.all(np.isnan(ys)):
                    ax.plot(middle, ys, marker="o", markersize=3, linestyle=style, color=colour(i),
                            label=f"{s.label} {name} {stat}")
                    drawn += 1
    ax.set_xlabel(f"time since the soak's start ({unit})")
    ax.set_ylabel("ms (requests completed in the window)")
    ax.set_ylim(bottom=0)
    ax.set_title("Latency per window")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize="small", ncol=2)
    else:
        _empty(ax, "no successful requests")
    return fig


def soak_attainment_figure(series: Sequence[TargetSeries]) -> Figure:
    """Each window's attainment in % (--slo) over the soak, and the required attainment dashed."""
    fig, (ax,) = _figure(4.0)
    unit, scale = _soak_scale(series)
    required: set[float] = set()
    for i, s in enumerate(series):
        t = s.soak_timeline()
        if t.required_attainment is None:
            continue
        required.add(100 * t.required_attainment)
        ax.plot([x / scale for x in t.middle_s], [np.nan if a is None else 100 * a for a in t.attainment],
                marker="o", markersize=3, color=colour(i), label=s.label)
    for needed in sorted(required):
        ax.axhline(needed, color="grey", linestyle="--", linewidth=1, label=f"--attainment {needed:g}%")
    ax.set_xlabel(f"time since the soak's start ({unit})")
    ax.set_ylabel("% of requests meeting every target")
    ax.set_ylim(0, 105)
    ax.set_title("SLO attainment per window")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize="small", loc="lower left")
    else:
        _empty(ax, "no soak judged against an SLO")
    return fig


def speculation_figure(series: Sequence[TargetSeries]) -> Figure:
    """Per level, draft acceptance (solid) and reasoning share (dashed), in %, for the series that have them."""
    fig, (ax,) = _figure(4.0)
    for i, s in enumerate(series):
        xs = [lv.level for lv in s.chart_levels]
        for field, name, style, marker in (("acceptance", "draft acceptance", "-", "o"),
                                           ("reasoning_share", "reasoning share", "--", "s")):
            ys = [np.nan if getattr(lv, field) is None else 100 * getattr(lv, field) for lv in s.chart_levels]
            if not np.all(np.isnan(ys)):
                ax.plot(xs, ys, marker=marker, linestyle=style, color=colour(i), label=f"{s.label} {name}")
    _concurrency_axis(ax, series)
    ax.set_ylabel("% of drafted / of output tokens")
    ax.set_ylim(0, 105)
    ax.set_title("Speculation and reasoning per level")
    if ax.lines:
        ax.legend(fontsize="small")
    else:
        _empty(ax, "no speculation, no reasoning")
    return fig


def _none_nan(values: Sequence[float | None]) -> list[float]:
    return [np.nan if v is None else v for v in values]


def energy_figure(series: Sequence[TargetSeries]) -> Figure:
    """Top: J per output token per level, gross (solid) and net of idle power (dashed); bottom: mean
    power. A level during which the machine changed gets a red ×."""
    fig, (top, bottom) = _figure(6.5, rows=2)
    for i, s in enumerate(series):
        p = energy_points(s)
        if not p.levels:
            continue
        top.plot(p.levels, _none_nan(p.j_per_token), marker="o", color=colour(i), label=f"{s.label} gross")
        if any(v is not None for v in p.net_j_per_token):
            top.plot(p.levels, _none_nan(p.net_j_per_token), marker="s", linestyle="--", color=colour(i),
                     label=f"{s.label} net of idle")
        bottom.plot(p.levels, _none_nan(p.mean_w), marker="o", color=colour(i), label=s.label)
        for ax, ys in ((top, p.j_per_token), (bottom, p.mean_w)):
            marked = [(x, y) for x, y, c in zip(p.levels, ys, p.changed) if c and y is not None]
            if marked:
                ax.scatter(*zip(*marked), marker="x", s=90, color="#c0392b", zorder=3,
                           label="machine changed" if ax is top and i == 0 else None)
    for ax, label in ((top, "J per output token"), (bottom, "mean power (W)")):
        _concurrency_axis(ax, series)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        if ax.lines:
            ax.legend(fontsize="small")
        else:
            _empty(ax, "no energy counters")
    top.set_title("Energy per level")
    return fig


def slo_figure(series: Sequence[TargetSeries]) -> Figure:
    """Per level, the attainment (% of judged requests meeting every latency target) of each series
    judged against an SLO, and the required attainment (--attainment) as a dashed line."""
    fig, (ax,) = _figure(4.0)
    required: set[float] = set()
    for i, s in enumerate(series):
        xs, ys, needed = attainment_points(s)
        if xs:
            ax.plot(xs, [np.nan if y is None else y for y in ys], marker="o", color=colour(i), label=s.label)
        if needed is not None:
            required.add(needed)
    for needed in sorted(required):
        ax.axhline(needed, color="grey", linestyle="--", linewidth=1, label=f"--attainment {needed:g}%")
    _concurrency_axis(ax, series)
    ax.set_ylabel("% of requests meeting every target")
    ax.set_ylim(0, 105)
    ax.set_title("SLO attainment per level")
    if ax.lines:
        ax.legend(fontsize="small")
    else:
        _empty(ax, "no level judged against an SLO")
    return fig


def sweep_charts(series: Sequence[TargetSeries]) -> dict[str, Callable[[Sequence[TargetSeries]], Figure]]:
    """A sweep's charts: the attainment chart when a level was judged against an SLO, the
    speculation chart when a level drafted or reasoned, the energy chart when a level has energy figures."""
    slo = {"slo": slo_figure} if has_slo(series) else {}
    speculation = {"speculation": speculation_figure} if any(level_extras(series)) else {}
    energy = {"energy": energy_figure} if has_energy(series) else {}
    return {**CHARTS, **slo, **speculation, **energy}


CHARTS = {
    "throughput": throughput_figure,
    "latency": latency_figure,
    "percentiles": percentile_figure,
    "probe": probe_figure,
    "decode": decode_figure,
}
SOAK_CHARTS = {
    "throughput-over-time": soak_throughput_figure,
    "latency-over-time": soak_latency_figure,
    "probe": probe_figure,
}


def soak_charts(series: Sequence[TargetSeries]) -> dict[str, Callable[[Sequence[TargetSeries]], Figure]]:
    """A soak's charts, with attainment over time when a soak was judged against an SLO."""
    extra: dict[str, Callable[[Sequence[TargetSeries]], Figure]] = {"attainment-over-time": soak_attainment_figure}
    return SOAK_CHARTS | (extra if has_soak_slo(series) else {})


def png_bytes(fig: Figure) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=DPI, facecolor="white")
    return out.getvalue()


def render_all(series: Sequence[TargetSeries], soak: bool = False) -> dict[str, bytes]:
    """Every chart (a soak's with `soak`; a sweep's `sweep_charts`) as PNG bytes, keyed by report section id."""
    charts = soak_charts(series) if soak else sweep_charts(series)
    return {name: png_bytes(draw(series)) for name, draw in charts.items()}


def trend_figure(points: Sequence, figure: str, unit: str, title: str) -> Figure:
    """`loadgen history trend --chart`: a figure over builds (or runs), each point its mean with its sd
    as an error bar (points: analysis/history_trend.py `Point`), in the order the table lists them."""
    fig, (ax,) = _figure(3.2)
    if not points:
        _empty(ax, "no runs")
        return fig
    x = np.arange(len(points))
    means = [p.mean for p in points]
    sds = [p.sd or 0.0 for p in points]
    ax.errorbar(x, means, yerr=sds, marker="o", color=colour(0), capsize=3, linewidth=1.2)
    ax.set_xticks(x, [p.name for p in points], rotation=30 if len(points) > 4 else 0, ha="right" if len(points) > 4
                  else "center", fontsize=7)
    ax.set_ylabel(f"{figure} ({unit})")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    return fig
