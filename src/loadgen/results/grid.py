"""A grid's results folder: grid.json beside one run folder per cell and repeat.

    GRID/grid.json                    the grid: its config and, per cell, every run's entry
    GRID/cells/c01/r1/server.log      the server's output (boot log first)
    GRID/cells/c01/r1/run/            the cell's measurement in today's format (analyze, report,
                                      compare and gate read it like any run)

grid.json (`schema` "loadgen.grid", `schema_version` 1) is rewritten atomically after every run, so
an interrupted grid can be resumed from it. Version history: 1, the first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analysis.grid import CellSummary, summarize_cell
from ..core.errors import ResultsError
from .reader import load_run

SCHEMA = "loadgen.grid"
SCHEMA_VERSION = 1
GRID_FILE = "grid.json"
DONE = ("ok", "failed")  # a run with one of these is not repeated by --resume


def is_grid(path: Path) -> bool:
    return (path / GRID_FILE).is_file()


def write_grid(root: Path, doc: dict[str, Any]) -> None:
    text = json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **doc}, indent=1)
    _write_atomic(root / GRID_FILE, text)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def load_grid(root: Path) -> dict[str, Any]:
    path = root / GRID_FILE
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{root}: no {GRID_FILE}; give a folder written by `loadgen grid`") from None
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: not a loadgen grid file")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(f"{path}: grid schema version {doc.get('schema_version')} is not one this loadgen reads")
    if not isinstance(doc.get("cells"), list):
        raise ResultsError(f"{path}: no cells")
    return doc


def _with_run(root: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """The entry with its run.json attached as `run` (None when it has none or it is unreadable)."""
    run = None
    if entry.get("status") == "ok" and entry.get("run_dir"):
        try:
            run = load_run(root / entry["run_dir"])
        except ResultsError:
            run = None
    return {**entry, "run": run}


def grid_summaries(root: Path, doc: dict[str, Any]) -> list[CellSummary]:
    """Each cell's summary over its runs, in the grid's cell order."""
    return [summarize_cell(cell["name"], cell["params"], [_with_run(root, e) for e in cell.get("runs", [])])
            for cell in doc["cells"]]


def grid_run_dirs(root: Path) -> list[tuple[str, Path]]:
    """(name, run folder) of every run that finished ok, cell by cell: "c01" (or "c01 r2" with repeats)."""
    doc = load_grid(root)
    several = doc.get("repeat", 1) > 1
    runs = [(cell["id"] + (f" r{e['repeat']}" if several else ""), root / e["run_dir"])
            for cell in doc["cells"] for e in sorted(cell.get("runs", []), key=lambda e: e["repeat"])
            if e.get("status") == "ok" and e.get("run_dir")]
    if not runs:
        raise ResultsError(f"{root}: no cell of this grid has a finished run to show")
    return runs
