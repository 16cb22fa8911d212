"""`loadgen history`: the runs the history store holds, newest first; `history check` judges the newest
run against the earlier runs of its identity with the gate's statistics; `history import` adds run
folders (docs/history.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import msgspec
from rich.table import Table

from ..analysis.history_check import DEFAULT_LOOKBACK, OK, REFUSED, baseline_runs
from ..core.errors import EXIT_NOT_ENFORCED, EXIT_USAGE, UserError
from ..results.history import (
    HistoryError,
    Location,
    default_path,
    exists,
    identities,
    import_folder,
    location,
    runs,
    shown,
    trend_rows,
)
from .common import user_errors
from .gate import gate_options
from .shared import console


class _Row(msgspec.Struct):
    """What the table shows of a history row (results/history.py `runs`), read by attribute."""

    started_utc: str | None = None
    kind: str | None = None
    label: str | None = None
    build_info: str | None = None
    model: str | None = None
    levels: int | None = None
    best_throughput_tok_s: float | None = None
    folder: str | None = None


def _store(history_path: str | None, must_exist: bool = True) -> Location:
    path = location(history_path) if history_path else default_path()
    if path is None:
        raise click.ClickException("history is off (LOADGEN_HISTORY=off): pass --history PATH.")
    if must_exist and not exists(path):
        raise click.ClickException(f"no history at {path} yet: finished runs are added to it.")
    return path


HISTORY_OPTION = click.option("--history", "history_path", metavar="PATH|URL",
                              help="The store to read: a SQLite file, or postgresql://... (default: as runs "
                                   "write it).")


@click.group("history", invoke_without_command=True)
@HISTORY_OPTION
@click.option("--kind", help="Only runs of this kind (sweep, capacity, replay, ...).")
@click.option("--label", help="Only this target label.")
@click.option("--model", help="Only runs of this model file (its name, as the table shows it).")
@click.option("--build", help="Only runs of this server build (/props build_info, as the table shows it).")
@click.option("--machine", help="Only runs on this machine (its hash: --format json shows it).")
@click.option("--workload", help="Only runs of this workload (its hash: --format json shows it).")
@click.option("--since", metavar="DATE", help="Only runs started at or after DATE (2026-12-01, or 2026-12-05T10:00).")
@click.option("--until", metavar="DATE", help="Only runs started before DATE.")
@click.option("--last", type=click.IntRange(min=1), help="Only the newest N rows.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def history_command(ctx: click.Context, history_path: str | None, kind: str | None, label: str | None,
                    model: str | None, build: str | None, machine: str | None, workload: str | None,
                    since: str | None, until: str | None, last: int | None, fmt: str) -> None:
    """List the runs in the history store: time, kind, target, build, model, levels, best throughput, folder."""
    if ctx.invoked_subcommand is not None:
        return
    path = _store(history_path)
    try:
        rows = runs(path, last=last, kind=kind, label=label, model=model, build=build, machine=machine,
                    workload=workload, since=since, until=until)
    except HistoryError as exc:
        raise click.ClickException(f"could not read the history {shown(path)} ({exc}).") from None
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"history: {shown(path)}")
    for name in ("started_utc", "kind", "label", "build_info", "model", "levels", "best tok/s", "folder"):
        table.add_column(name)
    for r in msgspec.convert(rows, list[_Row], strict=False):
        best = r.best_throughput_tok_s
        table.add_row(str(r.started_utc), str(r.kind), str(r.label), str(r.build_info or "-"), str(r.model or "-"),
                      str(r.levels), "-" if best is None else f"{best:.1f}", str(r.folder))
    console().print(table)


@history_command.command("import")
@click.option("--history", "history_path", metavar="PATH|URL",
              help="The store to add to: a SQLite file, or postgresql://... (default: as runs write it).")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True))
def import_command(history_path: str | None, folders: tuple[str, ...]) -> None:
    """Add existing run folders to the history store."""
    path = _store(history_path, must_exist=False)
    for folder in folders:
        try:
            added = import_folder(path, Path(folder))
        except (ValueError, HistoryError) as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"{folder}: {added} level row(s) added to {shown(path)}" if added else
                   f"{folder}: already in {shown(path)}, not added again", err=True)


@history_command.command("check")
@HISTORY_OPTION
@click.option("--label", help="The newest run's target to judge (needed when it has several).")
@click.option("--lookback", type=click.IntRange(min=1), default=DEFAULT_LOOKBACK, show_default=True,
              help="Judge against at most this many earlier runs of the same identity, newest first.")
@gate_options
def check_command(history_path: str | None, label: str | None, lookback: int, max_throughput_drop: str | None,
                  max_latency_rise: str | None, max_error_rate: str | None, confidence: str | None,
                  metrics: tuple[str, ...], strict: bool | None, config_file: str | None, noise_file: str | None,
                  allow_env_change: bool = False) -> None:
    """Judge the newest run in the history against the earlier runs of its identity (kind, target, model,
    workload, machine) with the gate's statistics: exit 1 on a regression, 3 when there are too few to tell,
    2 when no earlier run is like for like."""
    from .gate import env_guard, gate_config, load, noise_for, report_gate

    path = _store(history_path)
    with user_errors():
        try:
            known = identities(path)
        except HistoryError as exc:
            raise UserError(f"could not read the history {shown(path)} ({exc})") from None
        newest_run = max((r.started_utc, r.run_id) for r in known)[1] if known else None
        newest = [r for r in known if r.run_id == newest_run and (label is None or r.label == label)]
        if not newest:
            raise UserError(f"the newest run in {shown(path)} has no target {label!r}" if label else f"{shown(path)} holds no run")
        if len(newest) > 1:
            raise UserError(f"the newest run has {len(newest)} targets ({', '.join(str(r.label) for r in newest)}): "
                            "name one with --label")
        base = baseline_runs(newest[0], known, lookback)
        if base.status == REFUSED:
            raise UserError(base.reason(newest[0]), EXIT_USAGE)
        if base.status != OK:
            console(stderr=True).print(f"not enforced: {base.reason(newest[0])}", highlight=False, markup=False)
            sys.exit(EXIT_NOT_ENFORCED)
        config = gate_config(max_throughput_drop, max_latency_rise, max_error_rate, confidence, metrics, strict,
                             config_file)
        folders = [r.folder for r in base.runs if Path(r.folder, "run.json").is_file()]
        if len(folders) < len(base.runs):
            console(stderr=True).print(f"warning: {len(base.runs) - len(folders)} earlier run folder(s) are gone; "
                                       f"judging against the {len(folders)} left", highlight=False, markup=False)
        baseline = [run for folder in folders for run in load(folder, "baseline")]
        candidate = load(newest[0].folder, "candidate")
        console(stderr=True).print(f"history check: {newest[0].folder} against {len(baseline)} earlier run(s) of "
                                   f"target {newest[0].label}", highlight=False, markup=False)
        baseline, candidate = env_guard(baseline, candidate, allow_env_change)
        from ..analysis.gate import run_gate

        result = run_gate(baseline, candidate, config, floors=noise_for(folders[0], noise_file) if folders else None)
    report_gate(result, config.strict)


@history_command.command("trend")
@HISTORY_OPTION
@click.option("--metric", "figure", default="throughput_tok_s", show_default=True,
              type=click.Choice(["throughput_tok_s", "request_rate", "latency_ms_p50", "latency_ms_p99", "ttft_ms_p50",
                                 "ttft_ms_p99"]), help="The figure to follow (run.json's name).")
@click.option("--label", help="The target (needed when the newest run has several).")
@click.option("--level", type=float, help="The concurrency (or rate) to follow (needed when the runs have several).")
@click.option("--by", type=click.Choice(["build", "run"]), default="build", show_default=True,
              help="One point per llama.cpp build (mean ± sd of its runs), or per run.")
@click.option("--chart", type=click.Path(dir_okay=False), metavar="FILE.png",
              help="Also draw the trend (mean ± sd per point) into this PNG file.")
def trend_command(history_path: str | None, figure: str, label: str | None, level: float | None, by: str,
                  chart: str | None = None) -> None:
    """A figure over builds (or runs) for the newest run's identity (kind, target, model, workload, machine)."""
    from ..analysis.history_trend import FIGURES, trend

    path = _store(history_path)
    with user_errors():
        try:
            rows = trend_rows(path, figure, label)
        except HistoryError as exc:
            raise UserError(f"could not read the history {shown(path)} ({exc})") from None
        if not rows:
            raise UserError(f"{shown(path)} holds no run" + (f" of target {label!r}" if label else ""))
        newest = rows[-1].run
        labels = sorted({str(r.run.label) for r in rows if r.run.run_id == newest.run_id})
        if label is None and len(labels) > 1:
            raise UserError(f"the newest run has {len(labels)} targets ({', '.join(labels)}): name one with --label")
        rows = [r for r in rows if r.run.label == newest.label]
        levels = sorted({r.level for r in rows if r.run.run_id == newest.run_id and r.level is not None})
        if level is None and len(levels) > 1:
            raise UserError(f"the newest run has levels {', '.join(f'{lv:g}' for lv in levels)}: name one with --level")
        if level is not None and level not in levels:
            raise UserError(f"the newest run has no level {level:g}; its levels are "
                            f"{', '.join(f'{lv:g}' for lv in levels) or 'none'}")
        chosen = level if level is not None else (levels[0] if levels else None)
        drawn = trend([r for r in rows if r.level == chosen], by_build=by == "build")
        if not drawn.points:
            raise UserError(f"no run of target {newest.label} has {figure} at level {chosen:g}"
                            + (" (TTFT is measured on streamed runs only)" if figure.startswith("ttft") else ""))
    table = Table(title=f"{figure} ({FIGURES[figure]}) of target {newest.label} at level {chosen:g}, "
                        f"by {by}" if chosen is not None else figure)
    by_build = by == "build"
    for name in ("build", "first run", "runs", "mean", "sd", "change") if by_build else ("run", "value", "change"):
        table.add_column(name)
    for p in drawn.points:
        change = "-" if p.change is None else f"{p.change:+.1%}"
        if by_build:
            table.add_row(p.name, p.started_utc, str(p.runs), f"{p.mean:,.1f}",
                          "-" if p.sd is None else f"{p.sd:,.1f}", change)
        else:
            table.add_row(p.name, f"{p.mean:,.1f}", change)
    console().print(table)
    if chart:
        from ..output.charts import png_bytes, trend_figure

        try:
            Path(chart).write_bytes(png_bytes(trend_figure(drawn.points, figure, FIGURES[figure], str(table.title))))
        except OSError as exc:
            raise click.ClickException(f"could not write the chart {chart} ({exc.strerror})") from None
        console(stderr=True).print(f"chart: {chart}", highlight=False, markup=False)
    if drawn.left_out:
        console(stderr=True).print(f"{drawn.left_out} run(s) of another identity (model, workload, machine or kind) "
                                   "left out", highlight=False, markup=False)
