"""`loadgen export` and `loadgen report`: read results directories, hand them to output/exporters.py or output/html.py.

Errors a user can cause (a missing directory, a bad run.json, an unknown target, metric or format)
become one line and exit code 2. matplotlib is imported only when a report is drawn, so the
commands that measure never pay for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..core.errors import InputError
from ..results.reader import load_probe, load_records, load_run
from .common import results_dir, user_errors

EXPORT_FORMATS = ("hgrm", "hlog", "csv", "json", "jsonl", "parquet")
REPORT_FORMATS = ("html", "markdown")


def choice(value: str, allowed: tuple[str, ...], flag: str) -> str:
    if value not in allowed:
        raise InputError(f"{flag} {value!r}: choose one of {', '.join(allowed)}")
    return value


@click.command("export")
@click.argument("results_dir_text", metavar="RESULTS_DIR")
@click.option("--format", "output_format", required=True, help=f"One of {', '.join(EXPORT_FORMATS)}.")
@click.option("--metric", help="hgrm/hlog only: latency, latency_uncorrected, queue_wait, predicted_ms, ttft, tpot, "
                                 "schedule_lag or itl.  [default: every one the run has values for]")
@click.option("--target", help="Export only the target with this label.")
@click.option("--out", "out_dir", help="Directory to write into.  [default: RESULTS_DIR]")
@user_errors()
def export_command(results_dir_text: str, output_format: str, metric: str | None, target: str | None,
                   out_dir: str | None) -> None:
    """Write a sweep's data as HdrHistogram .hgrm/.hlog files, CSV or JSON, or its records as JSON lines or Parquet."""
    from ..output.exporters import export, select

    choice(output_format, EXPORT_FORMATS, "--format")
    source = results_dir(results_dir_text)
    data = select(load_run(source), load_records(source), target=target, metric=metric)
    out = Path(out_dir) if out_dir else source
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = export(output_format, data, out)
    except OSError as exc:
        raise InputError(f"cannot write to {out} ({exc.strerror or exc}); choose another --out") from None
    for path in written:
        click.echo(str(path))
    if not written:
        click.echo("nothing to export: no successful request has this metric", err=True)


def load_source(path_text: str) -> dict[str, Any]:
    path = results_dir(path_text)
    return {"name": path.resolve().name, "run": load_run(path), "records": load_records(path),
            "probe": load_probe(path)}


@click.command("report")
@click.argument("results_dirs", nargs=-1, required=True, metavar="RESULTS_DIR...")
@click.option("--out", "out_file", default="report.html", show_default=True,
              help="HTML file to write; the charts are also written as PNG files next to it.")
@click.option("--format", "output_format", default="html", show_default=True,
              help="html (a self-contained file) or markdown (level tables and verdicts on stdout).")
@user_errors()
def report_command(results_dirs: tuple[str, ...], out_file: str, output_format: str) -> None:
    """Charts, level tables and verdicts of one or more sweeps, overlaid."""
    from ..output import html as html_report

    choice(output_format, REPORT_FORMATS, "--format")
    series = html_report.build_series([load_source(d) for d in results_dirs])
    if output_format == "markdown":
        click.echo(html_report.markdown(series), nl=False)
        return
    out = Path(out_file)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        written = html_report.write_report(series, out)
    except OSError as exc:
        raise InputError(f"cannot write {out} ({exc.strerror or exc}); choose another --out") from None
    for path in written:
        click.echo(str(path))
