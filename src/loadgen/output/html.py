"""The report of one or more results directories: a self-contained HTML file, or Markdown tables.

A report overlays every target of every run given as a `TargetSeries` (one line per series in each
chart; the view model, `report_model.py`). A report of soak runs has its own sections
(`SOAK_SECTIONS`: the windows over time, the probe, the soak table); a sweep's level table gains
the attainment and goodput columns (and an attainment chart) when a level was judged against
latency targets (--slo), the speculation and reasoning columns when any level has them, energy per
token (and an energy chart) when a level has energy figures and a "machine" column when the machine
changed during a level. The charts come from `charts.py` as PNG images, always
written next to the HTML file (for papers and CI summaries). The page draws them with Plotly
(`interactive.py`: hover, legend toggles, zoom) with plotly.js inlined, or, static, inlines the PNGs
as data URIs; either way the file needs no network and no other file.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis.metric_defs import DECODE_TOK_S, LATENCY, QUEUE_WAIT, TTFA, Metric
from ..analysis.speculation import level_acceptance_text
from ..core.rundoc import Level, RunDocument, RunKind
from .environment import shown_net
from .files import ExportFiles, write_files
from .layout import Grid, filled_rows, grids_markdown, text_of
from .report_model import (
    INCOMPLETE,
    TargetSeries,
    has_energy,
    has_machine_changes,
    has_slo,
    has_soak_slo,
    level_extras,
    level_slo,
)

# (section id, heading, what the chart shows); the order of the report.
SECTIONS = [
    ("throughput", "Throughput vs concurrency",
     "Generated tokens per wall-clock second at each concurrency level; the dotted line marks the server's slot count."),
    ("latency", "Latency vs concurrency",
     "Top: latency p50 (solid) and p99 (dashed). Bottom: mean latency split into the server's work "
     "(prompt + decode) and the rest, mostly waiting for a free slot."),
    ("percentiles", "Latency by percentile",
     "HdrHistogram-style percentile curves of request latency per level (successful requests)."),
    ("probe", "Server queue over time",
     "llama-server's requests_deferred (/metrics) and busy slots (/slots) as sampled during the sweep; "
     "dotted lines mark level boundaries."),
    ("decode", "Per-request decode speed",
     "Distribution of each request's decode speed (timings.predicted_per_second) per level."),
    ("levels", "Levels and verdicts", "Every level of every target, and the saturation verdict."),
]

SOAK_SECTIONS = [
    ("throughput-over-time", "Throughput over time",
     "Generated tokens per second of each window (requests counted by completion time). Dashed: the means of "
     "the first and last windows that the drift compares; bars, on the right axis: failed requests per window."),
    ("latency-over-time", "Latency over time",
     "Latency p50 and p99 of the successful requests that completed in each window; TTFT p50 and p99 "
     "(dotted) when the soak streamed."),
    ("probe", "Server queue over time",
     "llama-server's requests_deferred (/metrics) and busy slots (/slots) as sampled during the soak."),
    ("soak", "Soak findings", "Per target: requests, the load offered, error-free time, drift and errors."),
]


SOAK_SLO_SECTION = (
    "attainment-over-time", "SLO attainment over time",
    "The share of each window's judged requests that met every latency target (--slo), by completion "
    "time, against the share required (--attainment, dashed); the soak table says whether it fell.")


def is_soak(series: Sequence[TargetSeries]) -> bool:
    """Whether the report is of soak runs (`loadgen report` does not mix them with sweeps)."""
    return bool(series) and all(s.kind is RunKind.SOAK for s in series)


SLO_SECTION = (
    "slo", "SLO attainment per level",
    "The share of each level's judged requests that met every latency target (--slo; errors always miss), "
    "against the share a level must reach (--attainment, dashed). A level below the line fails.")
ENERGY_SECTION = (
    "energy", "Energy per level",
    "Joules per output token, gross (solid) and net of idle power (dashed), and mean power per level, of the "
    "\"total\" energy source (RAPL packages + NVML GPUs), else the only one; a level during which the machine "
    "changed is marked ×.")
SPECULATION_SECTION = (
    "speculation", "Speculation and reasoning per level",
    "Draft acceptance (Σ draft_n_accepted / Σ draft_n of the level's successful requests) and the reasoning "
    "share (Σ reasoning tokens / Σ output tokens) per level; a level without drafts or reasoning has no point.")


def sections(series: Sequence[TargetSeries]) -> list[tuple[str, str, str]]:
    """The report's sections: a soak's, or a sweep's with the attainment chart when a level was judged
    against latency targets, the speculation chart when a level drafted or reasoned and the energy
    chart when a level has energy figures."""
    if is_soak(series):
        return SOAK_SECTIONS[:2] + [SOAK_SLO_SECTION] * has_soak_slo(series) + SOAK_SECTIONS[2:]
    return (SECTIONS[:-1] + [SLO_SECTION] * has_slo(series) + [SPECULATION_SECTION] * any(level_extras(series))
            + [ENERGY_SECTION] * has_energy(series) + SECTIONS[-1:])


# Where an interactive chart shows something other than its PNG twin, the note says what it shows.
INTERACTIVE_NOTES = {
    "latency": "Latency p50 (solid), p99 (dashed) and mean queue wait (dotted) per level; the PNG beside "
               "the report also splits mean latency into server work and queue wait.",
    "probe": "llama-server's requests_deferred (/metrics) and busy slots (/slots) as sampled during the run; "
             "dotted lines mark level starts. Drag on the chart or the slider below it to zoom.",
    "throughput-over-time": SOAK_SECTIONS[0][2] + " Drag on the chart or the slider below it to zoom.",
    "latency-over-time": SOAK_SECTIONS[1][2] + " Drag on the chart or the slider below it to zoom.",
}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _dist(level: Level, m: Metric, stat: str) -> Any:
    d = getattr(level, m.key)
    return None if d is None else getattr(d, stat)


TABLE_COLUMNS = ["C", "ok / failed", "tok/s", f"{LATENCY.header.removesuffix(' ms')} mean ms", "p50", "p90", "p99", "max",
                 f"{QUEUE_WAIT.header.removesuffix(' ms')} mean ms", f"{QUEUE_WAIT.short} p99", "queued", DECODE_TOK_S.header, "peak deferred",
                 "peak busy / slots", "batching gain", "ok req/s", "stopped"]
# Shown only when a level of the report was judged against latency targets (--slo; analysis/slo.py).
SLO_COLUMNS = ["attainment", "goodput req/s", "goodput tok/s", "most missed"]


# Shown only when a level of the report has them (analysis/speculation.py, analysis/reasoning.py).
DRAFT_COLUMNS = ["draft accepted", "drafted per out tok"]
REASONING_COLUMNS = ["reasoning share", f"{TTFA.header.removesuffix(' ms')} p50 ms"]
# Shown only when a level has energy figures (--environment with RAPL or NVML counters; analysis/energy.py),
# and when the machine changed during a level (analysis/env_drift.py).
ENERGY_COLUMNS = ["J/token", "net J/token", "mean W"]
CHANGED_COLUMNS = ["machine"]


@dataclass(frozen=True)
class Extras:
    """Which optional columns the level table has: any level drafted, any level's requests reasoned,
    any level judged against latency targets (--slo)."""

    drafting: bool = False
    reasoning: bool = False
    slo: bool = False
    energy: bool = False
    changed: bool = False  # the machine changed during a level

    @classmethod
    def of(cls, series: Sequence[TargetSeries]) -> Extras:
        return cls(*level_extras(series), slo=has_slo(series), energy=has_energy(series),
                   changed=has_machine_changes(series))

    def columns(self) -> list[str]:
        return (TABLE_COLUMNS[:-1] + SLO_COLUMNS * self.slo + DRAFT_COLUMNS * self.drafting
                + REASONING_COLUMNS * self.reasoning + ENERGY_COLUMNS * self.energy + CHANGED_COLUMNS * self.changed
                + TABLE_COLUMNS[-1:])


def slo_cells(level: Level) -> list[str]:
    """A level's attainment ("✗" when below the required share; "–" when nothing was judged or the
    level has no judgement), goodput in req/s and tok/s, and the target it missed most."""
    judged = level_slo(level)
    if judged is None:
        return ["–"] * len(SLO_COLUMNS)
    attainment = "–" if judged.attainment is None else f"{judged.attainment:.0%}{'' if judged.passed else ' ✗'}"
    return [attainment, _fmt(judged.goodput_req_s, 2), _fmt(judged.goodput_tok_s, 1), judged.most_missed or "–"]


def extra_cells(level: Level, extras: Extras, speculative: bool | None = None) -> list[str]:
    """With --slo, a level's `slo_cells`. A level's acceptance ("no speculation" when it drafted nothing, never 0%, unless its server
    said it speculates: `speculative`, run.json's server.speculative) and drafted tokens per output
    token; its reasoning share ("none" when no request reasoned) and time to the first answer."""
    cells = slo_cells(level) if extras.slo else []
    if extras.drafting:
        drafted_none = speculative and not level.draft_n
        cells += [level_acceptance_text(speculative, level.draft_n, level.draft_n_accepted),
                  _fmt(0.0 if drafted_none else level.drafted_per_output_token, 2)]
    if extras.reasoning:
        share = level.reasoning_share
        cells += ["none" if share is None else f"{share:.0%}", _fmt(_dist(level, TTFA, "p50"))]
    return cells + machine_cells(level, extras)


def machine_cells(level: Level, extras: Extras) -> list[str]:
    """With energy figures, a level's gross and net J per output token and mean W (core/rundoc.py
    `headline_energy`: the "total" source, else the only one); where the machine changed during a
    level, "changed:" and what changed."""
    cells = []
    if extras.energy:
        e = level.headline_energy
        cells += ["–"] * len(ENERGY_COLUMNS) if e is None else [
            _fmt(e.j_per_token, 3), _fmt(shown_net(e.net_j_per_token), 3), _fmt(e.mean_w, 1)]
    if extras.changed:
        cells.append("changed: " + "; ".join(level.environment_changed or []) if level.machine_changed else "")
    return cells


def level_row(series: TargetSeries, level: Level, extras: Extras = Extras()) -> list[str]:
    """One table row of a level: run.json's summary and its verdict figures, formatted (with `extras`,
    the SLO, speculation and reasoning cells before the last column)."""
    verdict = next((v for v in series.verdict.levels if v.level == level.level), None)
    failed = level.requests_failed + level.requests_cancelled
    queued_share = None if verdict is None else verdict.queued_share
    gain = None if verdict is None else verdict.batching_gain
    return [
        str(level.level),
        f"{level.requests_ok} / {failed}",
        _fmt(level.throughput_tok_s, 2),
        _fmt(_dist(level, LATENCY, "mean")),
        *(_fmt(_dist(level, LATENCY, s)) for s in ("p50", "p90", "p99", "max")),
        _fmt(_dist(level, QUEUE_WAIT, "mean")),
        _fmt(_dist(level, QUEUE_WAIT, "p99")),
        "–" if verdict is None else f"{verdict.queued}/{verdict.requests} ({queued_share:.0%})",
        _fmt(level.decode_tok_s_mean),
        _fmt(None if verdict is None else verdict.peak_deferred, 0),
        f"{_fmt(None if verdict is None else verdict.peak_busy_slots)} / {_fmt(series.total_slots)}",
        "–" if gain is None else f"{gain:.2f}×",
        _fmt(level.request_rate, 2),
        *extra_cells(level, extras, None if series.target.server is None else series.target.server.speculative),
        level.stopped_reason or "",
    ]


def verdict_sentences(series: TargetSeries) -> list[str]:
    lines = ([series.answer] if series.answer else []) + list(series.verdict.verdict)
    router = series.target.router
    if router is not None and router.verdict:  # a --models run: the thrash verdict (docs/router.md)
        lines.append(f"router: {router.verdict}")
    if series.target.error:
        lines.insert(0, f"error: {series.target.error}")
    if not series.complete:
        lines.append(f"This run is {INCOMPLETE}: it was stopped before every level finished.")
    return lines


def markdown(series: Sequence[TargetSeries]) -> str:
    """Every series' level table and verdict sentences as Markdown."""
    out = ["# loadgen report", ""]
    extras = Extras.of(series)
    columns = extras.columns()
    for s in series:
        out += [f"## {s.label}", ""]
        if s.levels:
            out.append("| " + " | ".join(columns) + " |")
            out.append("|" + "|".join("---:" if i != len(columns) - 1 else "---" for i in range(len(columns))) + "|")
            for level in s.levels:
                out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in level_row(s, level, extras)) + " |")
            out.append("")
        elif s.kind.has_levels:  # a kind without levels (slots, wake, ...) shows its own table
            out += ["No level was measured.", ""]
        out += [f"- {line}" for line in verdict_sentences(s)]
        out.append("")
        if s.tables:
            out += [grids_markdown(s.tables, []), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1150px;
       color: #222; background: #fff; padding: 0 1em; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.note { color: #555; } .badge { background: #c0392b; color: #fff; padding: 0.1em 0.5em; border-radius: 0.3em;
       font-size: 0.8em; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
td { white-space: nowrap; } th { background: #f3f3f3; vertical-align: bottom; }
.table-wrap { overflow-x: auto; max-width: 100%; } td:last-child { text-align: left; }
"""


def html_document(series: Sequence[TargetSeries], images: dict[str, bytes], sources: Sequence[str],
                  charts: dict[str, str] | None = None, script: str = "") -> str:
    """The report page: every section in SECTIONS. A section shows its chart from `charts` (an HTML
    fragment) when there is one, else its PNG from `images`; `script` (plotly.js) is inlined in <head>."""
    esc = html.escape
    charts = charts or {}
    incomplete = [s for s in series if not s.complete]
    head_script = [f'<script type="text/javascript">{script}</script>'] if script else []
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>loadgen report</title>", f"<style>{CSS}</style>", *head_script, "</head>", "<body>",
             "<h1>loadgen report</h1>",
             f'<p class="note">Runs: {esc(", ".join(sources))}. Generated '
             f'{esc(_dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"))}.</p>']
    if incomplete:
        names = sorted({s.run_name for s in incomplete})
        parts.append(f'<p><span class="badge">{INCOMPLETE}</span> {esc(", ".join(names))}: the run was stopped '
                     f"before every level finished; its figures cover only what was measured.</p>")
    for section_id, heading, note in sections(series):
        if section_id in charts:
            note = INTERACTIVE_NOTES.get(section_id, note)
        parts += [f'<section id="{section_id}">', f"<h2>{esc(heading)}</h2>", f'<p class="note">{esc(note)}</p>']
        if section_id in charts:
            parts.append(f'<div class="chart">{charts[section_id]}</div>')
        elif section_id in images:
            parts.append(f'<img src="{data_uri(images[section_id])}" alt="{esc(heading)}">')
        if section_id == "levels":
            parts += _levels_html(series)
        if section_id == "soak":
            parts += _soak_html(series)
        parts.append("</section>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def _levels_html(series: Sequence[TargetSeries]) -> list[str]:
    esc = html.escape
    parts = []
    extras = Extras.of(series)
    for s in series:
        badge = f' <span class="badge">{INCOMPLETE}</span>' if not s.complete else ""
        parts.append(f"<h3>{esc(s.label)}{badge}</h3>")
        if s.levels:
            parts.append('<div class="table-wrap"><table>')
            parts.append("<tr>" + "".join(f"<th>{esc(c)}</th>" for c in extras.columns()) + "</tr>")
            for level in s.levels:
                parts.append("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in level_row(s, level, extras)) + "</tr>")
            parts.append("</table></div>")
        elif s.kind.has_levels:  # a kind without levels (slots, wake, ...) shows its own table
            parts.append("<p>No level was measured.</p>")
        sentences = verdict_sentences(s)
        if sentences:
            parts.append("<ul>" + "".join(f"<li>{esc(line)}</li>" for line in sentences) + "</ul>")
        for table in s.tables:  # a chat run's per-turn table
            parts += [f"<h4>{esc(table.title)}</h4>", *grid_html(table)]
    return parts


def grid_html(grid: Grid) -> list[str]:
    """A terminal table (output/layout.py `Grid`) as an HTML table, every row naming its own key."""
    esc = html.escape
    parts = ['<div class="table-wrap"><table>',
             "<tr>" + "".join(f"<th>{esc(c.name)}</th>" for c in grid.columns) + "</tr>"]
    parts += ["<tr>" + "".join(f"<td>{esc(text_of(cell))}</td>" for cell in row) + "</tr>" for row in filled_rows(grid)]
    parts.append("</table></div>")
    return parts


def _soak_html(series: Sequence[TargetSeries]) -> list[str]:
    """Each soak's table (the one `loadgen analyze` prints), under its series' label."""
    from .tables import soak_table

    esc = html.escape
    parts = []
    for s in series:
        badge = f' <span class="badge">{INCOMPLETE}</span>' if not s.complete else ""
        parts.append(f"<h3>{esc(s.label)}{badge}</h3>")
        parts += grid_html(soak_table(RunDocument(targets=[s.target], kind=RunKind.SOAK)))
        sentences = verdict_sentences(s)
        if sentences:
            parts.append("<ul>" + "".join(f"<li>{esc(line)}</li>" for line in sentences) + "</ul>")
    return parts


def render_report(series: Sequence[TargetSeries], out_name: str, interactive: bool = False) -> ExportFiles:
    """The charts as <stem>-<section>.png, then the HTML file `out_name`, as (file name, bytes).
    interactive: the page draws Plotly charts (plotly must be installed: `interactive.available()`)."""
    from . import charts  # matplotlib is loaded only here

    soak = is_soak(series)
    images = charts.render_all(series, soak)
    stem = Path(out_name).stem
    files = [(f"{stem}-{section_id}.png", png) for section_id, png in images.items()]
    sources = list(dict.fromkeys(s.run_name for s in series))
    if interactive:
        from . import interactive as plotly_charts  # plotly is loaded only here

        page = html_document(series, images, sources, plotly_charts.render_all(series, soak),
                             plotly_charts.plotly_js())
    else:
        page = html_document(series, images, sources)
    files.append((out_name, page.encode("utf-8")))
    return files


def write_report(series: Sequence[TargetSeries], out: Path, interactive: bool = False) -> list[Path]:
    """Write the charts as <stem>-<section>.png next to `out`, then `out` itself; return every path."""
    return write_files(render_report(series, out.name, interactive), out.parent)
