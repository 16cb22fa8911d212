"""`loadgen history`: the runs the history store holds, newest first (docs/history.md)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import click
import msgspec
from rich.table import Table

from ..results.history import default_path, runs
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


@click.command("history")
@click.option("--history", "history_path", metavar="PATH", help="The store to read (default: as runs write it).")
@click.option("--kind", help="Only runs of this kind (sweep, capacity, replay, ...).")
@click.option("--label", help="Only this target label.")
@click.option("--last", type=click.IntRange(min=1), help="Only the newest N rows.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def history_command(history_path: str | None, kind: str | None, label: str | None, last: int | None,
                    fmt: str) -> None:
    """List the runs in the history store: time, kind, target, build, model, levels, best throughput, folder."""
    path = Path(history_path).expanduser() if history_path else default_path()
    if path is None:
        raise click.ClickException("history is off (LOADGEN_HISTORY=off): pass --history PATH.")
    if not path.exists():
        raise click.ClickException(f"no history at {path} yet: finished runs are added to it.")
    try:
        rows = runs(path, kind=kind, label=label, last=last)
    except sqlite3.Error as exc:
        raise click.ClickException(f"could not read the history {path} ({exc}).") from None
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"history: {path}")
    for name in ("started_utc", "kind", "label", "build_info", "model", "levels", "best tok/s", "folder"):
        table.add_column(name)
    for r in msgspec.convert(rows, list[_Row], strict=False):
        best = r.best_throughput_tok_s
        table.add_row(str(r.started_utc), str(r.kind), str(r.label), str(r.build_info or "-"), str(r.model or "-"),
                      str(r.levels), "-" if best is None else f"{best:.1f}", str(r.folder))
    console().print(table)
