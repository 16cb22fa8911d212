"""`loadgen export` and `loadgen report`: read results directories, hand them to output/exporters.py or output/html.py.

Errors a user can cause (a missing directory, a bad run.json, an unknown target, metric or format)
become one line and exit code 2. matplotlib is imported only when a report is drawn, so the
commands that measure never pay for it.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import click

from ..analysis.metric_defs import Metric, all_metrics
from ..core.errors import InputError
from ..core.rundoc import RunKind
from ..results.reader import load_probe, load_records, load_run_dict
from ..results.schema import CACHE_CAPACITY_FILE
from .common import results_dir, user_errors
from .help import output_option

if TYPE_CHECKING:
    from ..output.report_model import RunSource

EXPORT_FORMATS = ("hgrm", "hlog", "csv", "json", "jsonl", "parquet", "trace")
REPORT_FORMATS = ("html", "markdown")


@click.command("export")
@click.argument("results_dir_text", metavar="RESULTS_DIR")
@click.option("--format", "output_format", required=True, type=click.Choice(EXPORT_FORMATS),
              help="What to write: HdrHistogram files, tables, or the records themselves.")
@click.option("--metric", help=f"hgrm/hlog only: {Metric.names_text([m for m in all_metrics() if m.export])}.  "
                                 "[default: every one the run has values for]")
@click.option("--target", help="Export only the target with this label.")
@output_option("out_dir", "Directory to write into.  [default: RESULTS_DIR]", type=click.Path(file_okay=False))
@click.option("--force", is_flag=True, help="Overwrite files of the same names in the --output directory.")
@user_errors()
def export_command(results_dir_text: str, output_format: str, metric: str | None, target: str | None,
                   out_dir: str | None, force: bool) -> None:
    """Write a sweep's data as HdrHistogram .hgrm/.hlog files, CSV or JSON, or its records as JSON lines or Parquet."""
    from ..output.exporters import EXPORTERS, check_exportable, records_note, select
    from ..output.files import write_files
    from ..results.grid_file import one_run_in_grid

    source = one_run_in_grid(results_dir(results_dir_text))
    run = load_run_dict(source)  # the JSON and CSV exporters pass run.json's summaries on verbatim (ExportData)
    check_exportable(run, output_format)
    data = select(run, load_records(source), target=target, metric=metric)
    out = Path(out_dir) if out_dir else source
    files = EXPORTERS[output_format].render(data)
    there = next((out / name for name, _ in files if (out / name).exists()), None)
    if there is not None and not force:
        raise InputError(f"{there} exists; give --force to overwrite it, or another --output")
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = write_files(files, out)
    except OSError as exc:
        raise InputError(f"cannot write to {out} ({exc.strerror or exc}); choose another --output") from None
    note = records_note(data, output_format)
    if note:
        click.echo(note, err=True)
    for path in written:
        click.echo(str(path))
    if not written:
        click.echo("nothing to export: no successful request has this metric", err=True)


def load_source(path_text: str, name: str | None = None) -> RunSource:
    from ..output.kind_view import view_of
    from ..output.report_model import RunSource
    from ..results.reread import load_with_records

    path = results_dir(path_text)
    records = load_records(path)
    run = load_with_records(path, records)  # a level run.json lacks because the run was killed in it: summarised
    answer = view_of(run).answer
    return RunSource(name or path.resolve().name, run, records, load_probe(path),
                     answer(path, run) if answer is not None else None)


def load_sources(path_text: str) -> list[RunSource]:
    """A run folder's source, or a grid folder's: each cell's finished runs, named by cell (a grid's
    cell, GRID/c01: its runs, named by repeat)."""
    from ..results.grid_file import grid_run_dirs, is_grid, runs_in_grid

    path = results_dir(path_text)
    if (path / CACHE_CAPACITY_FILE).is_file():
        return cache_capacity_sources(path)
    if not is_grid(path):
        in_grid = runs_in_grid(path)
        if in_grid is None:
            return [load_source(path_text)]
        return [load_source(str(run_dir), f"{path.name} {run_dir.parent.name}") for run_dir in in_grid]
    return [load_source(str(run_dir), name) for name, run_dir in grid_run_dirs(path)]


def cache_capacity_sources(path: Path) -> list[RunSource]:
    """A cache-capacity folder's runs, one a K in K order (named "K=2"), the first with the folder's
    per-K table and its answer (where reuse collapsed)."""
    import dataclasses

    from ..output.cache import cache_capacity_table, collapse_line
    from ..results.grid_file import read_cache_capacity

    summary = read_cache_capacity(path)
    table = cache_capacity_table(summary)
    runs = sorted((int(d.name.removeprefix("k-")), d) for d in path.glob("k-*") if (d / "run.json").is_file()
                  and d.name.removeprefix("k-").isdigit())
    if not runs:
        raise InputError(f"{path} holds no K's run (k-1/run.json, ...): the cache-capacity run stopped before one")
    sources = [load_source(str(d), f"{path.name} K={k}") for k, d in runs]
    sources[0] = dataclasses.replace(sources[0], answer=collapse_line(summary), tables=[table])
    return sources


@click.command("report")
@click.argument("results_dirs", nargs=-1, required=True, metavar="RESULTS_DIR...")
@output_option("out_file", "HTML file to write; the charts are also written as PNG files next to it.  "
                           "[default: report.html in RESULTS_DIR]", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite an existing report file.")
@click.option("--static", is_flag=True,
              help="Inline the PNG charts instead of interactive Plotly ones (no JavaScript in the page).")
@click.option("--format", "output_format", default="html", show_default=True, type=click.Choice(REPORT_FORMATS),
              help="html (a self-contained file) or markdown (level tables and verdicts on stdout).")
@user_errors()
def report_command(results_dirs: tuple[str, ...], out_file: str | None, force: bool, static: bool,
                   output_format: str) -> None:
    """Charts, level tables and verdicts of one or more sweeps (or a grid's cells) or soaks, overlaid."""
    from ..output import html as html_report
    from ..output import interactive
    from ..output.report_model import build_series

    found = [(d, source) for d in results_dirs for source in load_sources(d)]
    sources = [source for _, source in found]
    if output_format == "markdown":
        click.echo(_markdown(html_report, sources), nl=False)
        return
    check_drawable(found)
    out = report_path(results_dirs, out_file, force)
    series = build_series(sources)
    if not static and not interactive.available():
        click.echo("plotly is not installed (pip install 'loadgen[report]'): the report shows static PNG charts",
                   err=True)
        static = True
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        written = html_report.write_report(series, out, interactive=not static)
    except OSError as exc:
        raise InputError(f"cannot write {out} ({exc.strerror or exc}); choose another --output") from None
    for path in written:
        click.echo(str(path))


ROW_KINDS = ("prefill", "depth")  # a run of these kinds has rows, not levels or windows: no charts


def check_drawable(found: list[tuple[str, RunSource]]) -> None:
    """The charts draw sweeps (and grids of them) or soaks, one kind per report; anything else is told in one line."""
    kinds = [(d, s.run.kind) for d, s in found]
    for where, kind in kinds:
        if kind in ROW_KINDS:
            raise InputError(f"{where} is a {kind} run and the report draws sweeps and soaks; "
                             f"`loadgen analyze {where}` prints its table")
    soaks = [d for d, kind in kinds if kind is RunKind.SOAK]
    if soaks and len(soaks) < len(kinds):
        other = next(d for d, kind in kinds if kind is not RunKind.SOAK)
        raise InputError(f"{soaks[0]} is a soak and {other} is not: a report draws soaks or sweeps, "
                         f"not both; give them to two reports")


def report_path(results_dirs: tuple[str, ...], out_file: str | None, force: bool) -> Path:
    """Where the HTML goes: --output, else report.html in the one results directory; never over a file
    that exists unless --force."""
    if out_file is None and len(results_dirs) > 1:
        raise InputError("a report of several runs needs --output FILE (it would not belong to one of them)")
    out = Path(out_file) if out_file else Path(results_dirs[0]) / "report.html"
    if out.exists() and not force:
        raise InputError(f"{out} exists; give --force to overwrite it, or another --output")
    return out


def _markdown(html_report: ModuleType, sources: list[RunSource]) -> str:
    """The sweeps' level tables and verdicts, and the table of each prefill, depth or soak run."""
    from ..output.layout import grids_markdown
    from ..output.report_model import build_series
    from ..output.tables import run_grids, run_lines

    docs = [s.run for s in sources]
    sweeps = [s for s, doc in zip(sources, docs, strict=True) if doc.kind.has_levels]
    parts = [html_report.markdown(build_series(sweeps))] if sweeps else []
    for doc in docs:
        if not doc.kind.has_levels:
            lines = run_lines(doc)
            parts.append(grids_markdown(run_grids(doc), lines.notes + lines.errors))
    return "\n".join(parts)
