"""Terminal rendering of a grid: one row per cell, its parameters as columns, and who wins on what."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from rich.console import Console
from rich.text import Text

from ..analysis.grid_cells import CellSummary, kv_warnings, machine_lines, short_params, who_wins
from ..analysis.metrics import MeanSd
from ..core.griddoc import GridDocument
from .layout import Column, Grid, print_table


def _ms(value: MeanSd | None, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value.mean:,.{digits}f}" + (f" ± {value.sd:,.{digits}f}" if value.sd is not None else "")


def _kv(cell: CellSummary) -> str:
    """The boot log's KV size beside loadgen's estimate; "=" when they agree to the hundredth."""
    logged, est = cell.kv_logged_mib, cell.kv_estimate_mib
    if logged is None and est is None:
        return "n/a"
    if logged is None:
        return f"est {est:.2f}"
    if est is None:
        return f"{logged:.2f}"
    mark = "=" if f"{logged:.2f}" == f"{est:.2f}" else "≠"
    return f"{logged:.2f} {mark} est {est:.2f}"


def _per_slot(cell: CellSummary) -> str:
    if cell.kv_logged_mib is None or not cell.n_slots:
        return "n/a"
    if cell.kv_unified:
        return "shared"
    return f"{cell.kv_logged_mib / cell.n_slots:.2f}"


def grid_table(cells: Sequence[CellSummary], param_names: Sequence[str], measure: str = "sweep") -> Grid:
    """A row per cell: its parameters (the key columns, repeated if the table must split), then its
    figures: a sweep's throughput and latency per level, a prefill's prompt tok/s and client TTFT per
    prompt length, a depth run's decode tok/s per depth; then the KV cache sizes."""
    if measure in ("prefill", "depth"):
        return _size_table(cells, param_names, measure)
    if measure == "capacity":
        return _capacity_table(cells, param_names)
    if measure == "cache-capacity":
        return _cache_capacity_table(cells, param_names)
    levels = sorted({lv for c in cells for lv in c.latency_by_level}, key=float)
    grid = Grid("loadgen grid", [
        *(Column(name, "left", key=True) for name in param_names),
        *(Column(name) for name in ("runs ok", "single-stream\ntok/s", "peak tok/s", "peak\nat", "saturated\nat",
                                    *(f"latency ms\nat {lv}" for lv in levels), "KV MiB (boot log\nvs loadgen kv)",
                                    "KV MiB\nper slot"))])
    for c, shown in zip(cells, short_params([c.params for c in cells])):
        grid.add_row(*(Text(shown.get(n, "")) for n in param_names), f"{c.runs_ok}/{c.runs}",  # values, not markup
                     _ms(c.single_stream_tok_s), _ms(c.peak_tok_s), str(c.peak_at if c.peak_at is not None else "-"),
                     str(c.saturated_at if c.saturated_at is not None else "-"),
                     *(_ms(c.latency_by_level.get(lv), 0) for lv in levels), _kv(c), _per_slot(c))
    return grid


def _size_table(cells: Sequence[CellSummary], param_names: Sequence[str], measure: str) -> Grid:
    if measure == "prefill":
        lengths = sorted({n for c in cells for n in c.prompt_tok_s_by_length | c.ttft_by_length})
        figures = [*((f"prompt tok/s\nat {n}", lambda c, n=n: _ms(c.prompt_tok_s_by_length.get(n), 0))
                     for n in lengths),
                   *((f"TTFT ms\nat {n}", lambda c, n=n: _ms(c.ttft_by_length.get(n), 1)) for n in lengths)]
    else:
        depths = sorted({d for c in cells for d in c.decode_by_depth})
        figures = [(f"decode tok/s\nat depth {d}", lambda c, d=d: _ms(c.decode_by_depth.get(d), 1)) for d in depths]
    grid = Grid(f"loadgen grid ({measure})", [
        *(Column(name, "left", key=True) for name in param_names), Column("runs ok"),
        *(Column(head) for head, _ in figures), Column("KV MiB (boot log\nvs loadgen kv)"), Column("KV MiB\nper slot")])
    for c, shown in zip(cells, short_params([c.params for c in cells])):
        grid.add_row(*(Text(shown.get(n, "")) for n in param_names), f"{c.runs_ok}/{c.runs}",
                     *(value(c) for _, value in figures), _kv(c), _per_slot(c))
    return grid


def _capacity_table(cells: Sequence[CellSummary], param_names: Sequence[str]) -> Grid:
    """A capacity grid: each cell's capacity over its runs (`analysis.grid_capacity`), the target
    that bound it, and the KV cache sizes."""
    by_rate = any(c.capacity and c.capacity.by == "rate" for c in cells)
    grid = Grid("loadgen grid (capacity)", [
        *(Column(name, "left", key=True) for name in param_names), Column("runs ok"),
        Column("capacity\n(req/s)" if by_rate else "capacity\n(users)"), Column("binding"),
        Column("KV MiB (boot log\nvs loadgen kv)"), Column("KV MiB\nper slot")])
    for c, shown in zip(cells, short_params([c.params for c in cells])):
        grid.add_row(*(Text(shown.get(n, "")) for n in param_names), f"{c.runs_ok}/{c.runs}",
                     Text(c.capacity.text if c.capacity else "n/a"), c.binding or "-", _kv(c), _per_slot(c))
    return grid


def _cache_capacity_table(cells: Sequence[CellSummary], param_names: Sequence[str]) -> Grid:
    """A cache-capacity grid: the warm conversations each cell holds over its runs
    (`analysis.grid_capacity.cell_held`) beside the prediction, and the KV cache sizes."""
    grid = Grid("loadgen grid (cache-capacity)", [
        *(Column(name, "left", key=True) for name in param_names), Column("runs ok"),
        Column("warm conversations\nheld"), Column("predicted"),
        Column("KV MiB (boot log\nvs loadgen kv)"), Column("KV MiB\nper slot")])
    for c, shown in zip(cells, short_params([c.params for c in cells])):
        grid.add_row(*(Text(shown.get(n, "")) for n in param_names), f"{c.runs_ok}/{c.runs}",
                     Text(c.capacity.text if c.capacity else "n/a"),
                     "n/a" if c.predicted_held is None else str(c.predicted_held), _kv(c), _per_slot(c))
    return grid


CACHE_CAPACITY_KEY = ("warm conversations held: round-robin conversations whose warm turns still reused their "
                      "prefix, the collapse K - 1 (≥K: no collapse up to the largest K measured; 2–3: between the "
                      "Ks measured); mean ± sd (each run's answer) over the repeats; predicted: from the slots and the "
                      "saved slot states --cache-ram holds (docs/cache.md)")
CAPACITY_KEY = ("capacity: the most users (req/s) within --slo; mean ± sd (each run's answer) over the repeats; "
                "3–4: between 3 and 4 (inconclusive at this noise); ≥8: no level failed up to 8")


class _Param(msgspec.Struct):
    name: str


class _Heading(msgspec.Struct):
    """What the table reads of a grid: its parameters' names and what ran against each cell."""

    params: list[_Param] = []
    measure: str = "sweep"


def print_grid(console: Console, grid: GridDocument | Mapping[str, Any], cells: Sequence[CellSummary]) -> None:
    """The table, the failures with their reasons, and one line per question of who wins. `grid`: the
    grid's document, or as much of its content as the table reads (its params' names, its measure)."""
    heading = msgspec.convert(grid, _Heading, from_attributes=True)
    print_table(console, grid_table(cells, [p.name for p in heading.params], heading.measure))
    key = {"capacity": CAPACITY_KEY, "cache-capacity": CACHE_CAPACITY_KEY}.get(heading.measure)
    if key:
        console.print(key, style="dim", highlight=False, soft_wrap=True, markup=False)
    for c in cells:
        if c.failure:
            console.print(f"{c.name}: {c.failure}", style="yellow", highlight=False, soft_wrap=True, markup=False)
    for line in kv_warnings(cells):
        console.print(f"warning: {line}", style="yellow", highlight=False, soft_wrap=True, markup=False)
    for line in who_wins(cells):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    for line in machine_lines(cells):
        console.print(f"environment: {line}", style="yellow", highlight=False, soft_wrap=True, markup=False)
