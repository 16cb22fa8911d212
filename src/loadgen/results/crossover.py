"""A grid's two speculation cells as the crossover verdict reads them (analysis/crossover.py).

The grid's template carries the server's own speculation flags through one parameter (its flag
names changed in 2026, so loadgen never spells them): e.g. `--param spec=none,ngram-simple` with
`--spec-type {spec}` in the template. The "on" and "off" cells are the ones whose value of that
parameter is the given one; every other parameter must be equal between them. Per level, each
side's throughput per repeat; only repeats both cells finished are kept, in repeat order, so
repeat i of one side pairs with repeat i of the other (the grid ran them back to back).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from ..core.errors import ConfigError, ResultsError
from ..core.griddoc import GridCell, GridDocument, GridRun
from .atomic import write_json
from .grid_file import load_grid
from .reader import load_run_dict

CROSSOVER_FILE = "crossover.json"  # the last `loadgen crossover` question asked of a grid, in its folder


class CrossoverQuestion(msgspec.Struct, frozen=True):
    """What `loadgen crossover` was asked of a grid (crossover.json): `analyze GRID` asks it again
    of the grid's runs as they are now, so the answer is rebuilt, never stale."""

    param: str
    on: str
    off: str
    confidence: float


def save_question(grid_dir: Path, question: CrossoverQuestion, answer: dict[str, Any]) -> None:
    """crossover.json: the question and the answer it got (for other tools; `analyze` recomputes it)."""
    write_json(grid_dir / CROSSOVER_FILE, {**msgspec.to_builtins(question), **answer})


def saved_question(grid_dir: Path) -> CrossoverQuestion | None:
    """The question crossover.json holds; None without a readable one."""
    try:
        return msgspec.json.decode((grid_dir / CROSSOVER_FILE).read_bytes(), type=CrossoverQuestion)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _cell(grid: GridDocument, param: str, value: str, others: dict[str, str] | None) -> GridCell:
    cells = [c for c in grid.cells if c.params.get(param) == value
             and (others is None or {k: v for k, v in c.params.items() if k != param} == others)]
    if not cells:
        raise ConfigError(f"no cell of this grid has {param}={value}; its values are "
                          f"{', '.join(sorted({c.params.get(param, '?') for c in grid.cells}))}")
    if len(cells) > 1:
        raise ConfigError(f"{len(cells)} cells have {param}={value}: the grid varies another parameter too; "
                          "give a grid of the speculation parameter alone")
    return cells[0]


def spec_sides(root: Path, param: str, on: str, off: str) -> tuple[dict[Any, list[float]], dict[Any, list[float]]]:
    """(on, off): per level, throughput tok/s of each repeat both cells finished. Raises ConfigError
    (a parameter or value the grid lacks) and ResultsError (an unreadable grid)."""
    grid = load_grid(root)
    if param not in grid.param_names:
        raise ConfigError(f"--param {param!r}: the grid's parameters are {', '.join(grid.param_names)}")
    on_cell = _cell(grid, param, on, None)
    others = {k: v for k, v in on_cell.params.items() if k != param}
    off_cell = _cell(grid, param, off, others)
    by_repeat = [{e.repeat: _levels(root, e) for e in cell.runs} for cell in (on_cell, off_cell)]
    on_side: dict[Any, list[float]] = {}
    off_side: dict[Any, list[float]] = {}
    for repeat in sorted(set(by_repeat[0]) & set(by_repeat[1])):
        a, b = by_repeat[0][repeat], by_repeat[1][repeat]
        for level in sorted(set(a) & set(b)):
            on_side.setdefault(level, []).append(a[level])
            off_side.setdefault(level, []).append(b[level])
    return on_side, off_side


def _levels(root: Path, entry: GridRun) -> dict[Any, float]:
    """A finished run's throughput per level that ran to its end; {} for a failed or unreadable run."""
    if not entry.finished:
        return {}
    try:
        run = load_run_dict(root / str(entry.run_dir))
    except ResultsError:
        return {}
    levels = (run.get("targets") or [{}])[0].get("levels") or []
    return {lv["level"]: lv["throughput_tok_s"] for lv in levels
            if lv.get("throughput_tok_s") and not lv.get("stopped_reason")}
