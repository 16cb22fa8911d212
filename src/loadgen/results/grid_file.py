"""A grid's results folder: grid.json beside one run folder per cell and repeat.

    GRID/grid.json                    the grid: its config and, per cell, every run's entry
    GRID/cells/c01/r1/server.log      the server's output (boot log first)
    GRID/cells/c01/r1/run/            the cell's measurement in today's format (analyze, report,
                                      compare and gate read it like any run)

grid.json (`schema` "loadgen.grid", `schema_version` 1) is rewritten atomically after every run, so
an interrupted grid can be resumed from it. Version history: 1, the first.

Every reader (analyze, report, grid --resume) goes through `load_grid`, which checks the file against
the typed shape below (`GridFile`, msgspec) and the rules types cannot say (cell ids that are folder
names and unique, parameters that are the template's placeholders): a damaged or hand-edited
grid.json is one line (`ResultsError`, exit 2), not a traceback in whichever reader trips first.
Unknown fields are allowed (newer writers add some); a field readers rely on is checked here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from ..analysis.grid_cells import CellSummary, GridParam, check_template, summarize_cell
from ..core.errors import ConfigError, ResultsError
from .reader import load_run

SCHEMA = "loadgen.grid"
SCHEMA_VERSION = 1
GRID_FILE = "grid.json"
DONE = ("ok", "failed")  # a run with one of these is not repeated by --resume


class BootEntry(msgspec.Struct):
    """What the grid table reads of a run's boot-log facts (`analysis.bootlog.BootFacts.to_dict`)."""

    n_slots: int | None = None
    kv_unified: bool | None = None
    kv_size_mib: float | None = None


class KvEstimateEntry(msgspec.Struct):
    kv_mib: float | None = None


class GridRun(msgspec.Struct):
    """One run of a cell: its repeat number, how it ended and where its results are."""

    repeat: Annotated[int, msgspec.Meta(ge=1)]
    status: str
    run_dir: str | None = None
    reason: str | None = None
    boot: BootEntry | None = None
    kv_estimate: KvEstimateEntry | None = None
    log_tail: list[str] = []


class GridCell(msgspec.Struct):
    id: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]+$")]  # the cell's folder under cells/
    name: str
    params: dict[str, str]
    runs: list[GridRun] = []


class GridParamEntry(msgspec.Struct):
    name: str
    values: list[str]


class GridFile(msgspec.Struct):
    """What grid.json must hold for analyze, report and grid --resume to read it."""

    cells: list[GridCell]
    params: list[GridParamEntry]
    repeat: Annotated[int, msgspec.Meta(ge=1)]
    template: str
    measure: Literal["sweep", "prefill", "depth"]
    measure_args: list[str]
    wait_ready_s: Annotated[float, msgspec.Meta(ge=0)]


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
    """Read and check grid.json. Raises ResultsError with a one-line reason."""
    path = root / GRID_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except FileNotFoundError:
        raise ResultsError(f"{root}: no {GRID_FILE}; give a folder written by `loadgen grid`") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError included
        raise ResultsError(f"{path}: not readable JSON ({_first_line(exc)})") from None
    except RecursionError:
        raise ResultsError(f"{path}: not readable JSON (nested too deep)") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultsError(f"{path}: not a loadgen grid file")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(f"{path}: grid schema version {doc.get('schema_version')!r} is not one this loadgen reads")
    try:
        grid = msgspec.convert(doc, GridFile)
    except msgspec.ValidationError as exc:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({_first_line(exc)})") from None
    problem = _grid_problem(grid)
    if problem:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({problem})")
    return doc


def _grid_problem(grid: GridFile) -> str | None:
    """What the types cannot say: ids unique, and every cell's parameters the template's placeholders."""
    ids = [c.id for c in grid.cells]
    twice = next((i for i in ids if ids.count(i) > 1), None)
    if twice:
        return f"cell id {twice!r} is given twice"
    names = [p.name for p in grid.params]
    try:
        check_template(grid.template, [GridParam(p.name, tuple(p.values)) for p in grid.params])
    except ConfigError as exc:
        return f"its template and params do not fit: {exc}"
    cell = next((c for c in grid.cells if sorted(c.params) != sorted(names)), None)
    if cell is not None:
        return f"cell {cell.id}'s parameters {sorted(cell.params)} are not the grid's {names}"
    return None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]


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
