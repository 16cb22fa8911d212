"""A grid's results folder: grid.json beside one run folder per cell and repeat.

    GRID/grid.json                    the grid: its config and, per cell, every run's entry
    GRID/cells/c01/r1/server.log      the server's output (boot log first)
    GRID/cells/c01/r1/run/            the cell's measurement in today's format (analyze, report,
                                      compare and gate read it like any run); with --measure
                                      capacity also its capacity.json, whose answer grid.json keeps;
                                      with --measure cache-capacity a cache-capacity folder (k-K/
                                      runs, cache-capacity.json, whose result grid.json keeps)

grid.json (`schema` "loadgen.grid", `schema_version` 1) is rewritten atomically after every run, so
an interrupted grid can be resumed from it. Version history: 1, the first (a run's `capacity`,
--measure capacity's answer, and `cache_capacity`, --measure cache-capacity's result, were added to
it as optional fields: older readers drop them).

Every reader (analyze, report, grid --resume) goes through `load_grid`, which checks the file against
the typed document (`core.griddoc.GridDocument`, msgspec) and the rules types cannot say (cell ids that are folder
names and unique, parameters that are the template's placeholders): a damaged or hand-edited
grid.json is one line (`ResultsError`, exit 2), not a traceback in whichever reader trips first.
Unknown fields are allowed (newer writers add some); a field readers rely on is checked here.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from ..analysis.grid_cells import CellRun, CellSummary, GridParam, check_template, summarize_cell
from ..analysis.kv import INFEASIBLE
from ..core.errors import ConfigError, ResultsError
from ..core.griddoc import CacheCapacityEntry, CapacityEntry, GridCell, GridDocument, GridRun
from .atomic import atomic_write
from .reader import load_run
from .schema import CACHE_CAPACITY_FILE, CAPACITY_FILE, RUN_FILE

SCHEMA = "loadgen.grid"
SCHEMA_VERSION = 1
GRID_FILE = "grid.json"
DONE = ("ok", "failed", INFEASIBLE)  # a run with one of these is not repeated by --resume


def is_grid(path: Path) -> bool:
    return (path / GRID_FILE).is_file()


def write_grid(root: Path, grid: GridDocument) -> None:
    text = json.dumps({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **msgspec.to_builtins(grid)}, indent=1)
    atomic_write(root / GRID_FILE, [text])


def load_grid(root: Path) -> GridDocument:
    """Read and check grid.json: its typed document. Raises ResultsError with a one-line reason."""
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
        grid = msgspec.convert(doc, GridDocument)
    except msgspec.ValidationError as exc:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({_first_line(exc)})") from None
    problem = _grid_problem(grid)
    if problem:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({problem})")
    return grid


def _grid_problem(grid: GridDocument) -> str | None:
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


def read_capacity(run_dir: Path) -> CapacityEntry:
    """A capacity run's answer from its capacity.json (`loadgen capacity`'s file). Raises ResultsError
    with a one-line reason when it is missing or not one."""
    path = run_dir / CAPACITY_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
        return msgspec.convert(doc["capacity"], CapacityEntry)
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing; the capacity search wrote no answer") from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError, msgspec.ValidationError) as exc:
        raise ResultsError(f"{path}: not a capacity answer ({_first_line(exc)})") from None


def read_cache_capacity(run_dir: Path) -> CacheCapacityEntry:
    """A cache-capacity run's result from its cache-capacity.json (`loadgen cache-capacity`'s file).
    Raises ResultsError with a one-line reason when it is missing or not one."""
    path = run_dir / CACHE_CAPACITY_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
        return msgspec.convert(doc, CacheCapacityEntry)
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing; the cache-capacity run wrote no result") from None
    except (OSError, ValueError, TypeError, RecursionError, msgspec.ValidationError) as exc:
        raise ResultsError(f"{path}: not a cache-capacity result ({_first_line(exc)})") from None


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]


def _cell_run(root: Path, entry: GridRun) -> CellRun:
    """The entry with its run.json (None when it has none or it is unreadable)."""
    run = None
    if entry.finished:
        try:
            run = load_run(root / str(entry.run_dir))
        except ResultsError:
            run = None
    return CellRun.of(entry, run)


def grid_summaries(root: Path, grid: GridDocument) -> list[CellSummary]:
    """Each cell's summary over its runs, in the grid's cell order."""
    return [summarize_cell(cell.name, cell.params, [_cell_run(root, e) for e in cell.runs]) for cell in grid.cells]


def grid_run_dirs(root: Path) -> list[tuple[str, Path]]:
    """(name, run folder) of every run that finished ok, cell by cell: "c01 parallel=1" (or "c01 r2
    parallel=1" with repeats)."""
    grid = load_grid(root)
    several = grid.repeat > 1
    runs = [(cell.id + (f" r{e.repeat}" if several else "") + f" {cell.name}", root / str(e.run_dir))
            for cell in grid.cells for e in cell.finished_runs()]
    if not runs:
        raise ResultsError(f"{root}: no cell of this grid has a finished run to show")
    return runs


def _cell_list(root: Path, grid: GridDocument) -> str:
    return ", ".join(f"{root / c.id} ({c.name})" for c in grid.cells)


def runs_in_grid(path: Path) -> list[Path] | None:
    """The finished run folders `path` names inside a grid, or None when it is not a grid's path:
    GRID/cells/c01, GRID/c01 or GRID/<cell name> (every finished repeat of the cell), and
    GRID/cells/c01/r2 (that repeat's run). GRID itself, or a cell it does not have, is a ResultsError
    naming its cells: a grid is many runs, and the command wants one (or one cell's)."""
    if (path / RUN_FILE).is_file():
        return None
    if is_grid(path):
        raise ResultsError(f"{path} is a grid; give one of its cells: {_cell_list(path, load_grid(path))}")
    if len(path.parents) > 2 and path.parent.parent.name == "cells" and is_grid(path.parents[2]) \
            and (path / "run" / RUN_FILE).is_file():
        return [path / "run"]
    if path.parent.name == "cells" and is_grid(path.parent.parent):
        root = path.parent.parent
    elif not path.exists() and is_grid(path.parent):
        root = path.parent
    else:
        return None
    grid = load_grid(root)
    cell: GridCell | None = next((c for c in grid.cells if path.name in (c.id, c.name)), None)
    if cell is None:
        raise ResultsError(f"{root} has no cell {path.name!r}; its cells: {_cell_list(root, grid)}")
    runs = [root / str(e.run_dir) for e in cell.finished_runs()]
    if not runs:
        raise ResultsError(f"cell {cell.id} ({cell.name}) of {root} has no finished run")
    return runs


def one_run_in_grid(path: Path) -> Path:
    """`path` itself, or the one finished run it names inside a grid (`runs_in_grid`); a cell with
    several runs is a ResultsError naming them."""
    runs = runs_in_grid(path)
    if runs is None:
        return path
    if len(runs) > 1:
        raise ResultsError(f"{path} has {len(runs)} runs; give one: " + ", ".join(str(r.parent) for r in runs))
    return runs[0]
