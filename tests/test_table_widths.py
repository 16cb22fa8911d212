"""Every table loadgen draws fits 80, 100 and 120 columns without cutting a figure.

The tables are rendered from the golden runs, from hand-made prefill, depth and soak runs, from a
comparison, and from a "wide" copy of each run whose figures are a thousand times larger and whose
targets carry 24-character labels. Every cell of every table (figures, counts, ratios, labels) must
appear whole on one line of the output; a note's words may wrap, but none may be cut. At 80
columns the wide sweep table cannot fit on one screen, and is drawn as a table and its
continuation, both naming their rows."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
from rich.console import Console

from loadgen.analysis.compare import compare_sides
from loadgen.analysis.depth import DepthRow, summarize_depth, with_change
from loadgen.analysis.grid_cells import CellSummary
from loadgen.analysis.metrics import MeanSd
from loadgen.analysis.prefill import summarize_prefill
from loadgen.analysis.soak import summarize_soak
from loadgen.core import records
from loadgen.core.records import RequestRecord
from loadgen.output.comparison import comparison_table
from loadgen.output.grid_table import grid_table
from loadgen.output.layout import Grid, Num, rich_tables, text_of
from loadgen.output.tables import run_grids
from loadgen.results.reader import load_run_dict
from loadgen.results.sides import load_side

DATA = Path(__file__).parent / "data"
GOLDEN = ["sweep-smollm2", "sweep-sim-v2", "rate-sim-v2"]
WIDTHS = (80, 100, 120)
S = 1_000_000_000
LONG = ["SmolLM2-135M…Q4_1@18280", "SmolLM2-135M…Q4_1@18281"]


def rec(send_s: float, done_s: float, *, error: str | None = None, **fields) -> RequestRecord:
    return RequestRecord(target="t", level=1, worker=0, seq=0, salt="s", send_ns=int(send_s * S),
                         complete_ns=int(done_s * S), status=None if error else 200, error_kind=error, **fields)


def prefill_doc() -> dict:
    def rows(scale: float) -> list[dict]:
        return [summarize_prefill(n, [rec(0, n / 800 * scale, prompt_n=n, prompt_ms=n / 0.8 * scale, predicted_n=1),
                                      rec(1, 1 + n / 700 * scale, prompt_n=n + 1, prompt_ms=n / 0.7 * scale,
                                          predicted_n=1)]).to_dict()
                for n in (1000, 8000, 32000)]
    return {"kind": "prefill", "complete": True,
            "targets": [{"label": "moe", "prefill": {"rows": rows(1)}}, {"label": "dense", "prefill": {"rows": rows(6.5)}}]}


def depth_doc() -> dict:
    rows = with_change([summarize_depth(0, [rec(0, 1, predicted_per_second=47.6, prompt_n=39)]),
                        summarize_depth(4096, [rec(0, 1, predicted_per_second=41.2, prompt_n=4096),
                                               rec(1, 2, predicted_per_second=40.1, prompt_n=4096)]),
                        DepthRow(depth=32768, skipped="skipped: prompt 32,768 + n_predict 64 > per-slot n_ctx 8,192")])
    return {"kind": "depth", "complete": True, "targets": [{"label": "moe", "depth": {"rows": [r.to_dict() for r in rows]}}]}


def soak_doc() -> dict:
    rs = [rec(t, t + 0.5, predicted_n=(1000 if t < 10800 else 800) + t % 7) for t in range(0, 21600, 60)]
    rs += [rec(54, 55, error=records.CONNECT_ERROR), rec(56, 57, error=records.DISCONNECTED)]
    soak = summarize_soak(rs, 0, 21600 * S, window_s=600).to_dict()
    return {"kind": "soak", "complete": False, "targets": [{"label": "moe", "soak": soak}]}


def widened(doc: dict) -> dict:
    """The same run with every figure ×1000 and the longest labels a default can have."""
    wide = copy.deepcopy(doc)

    def grow(node):
        if isinstance(node, dict):
            return {k: (v if k in ("level", "concurrency", "rate", "prompt_tokens", "depth", "total_slots")
                        else grow(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [grow(v) for v in node]
        return node * 1000 if isinstance(node, (int, float)) and not isinstance(node, bool) else node

    wide["targets"] = [{**grow(t), "label": LONG[i % 2]} for i, t in enumerate(wide["targets"])]
    for t in wide["targets"]:  # the verdicts name levels by their label; keep them matching
        if t.get("verdict"):
            t["verdict"]["verdict"] = []
    return wide


def comparison_grid() -> Grid:
    side = load_side(DATA / "sweep-sim-v2")
    return comparison_table(compare_sides(side, side))


def grid_summary_grid() -> Grid:
    """A grid of two parameters over five levels, figures as big as a fast server's."""
    cells = [CellSummary(
        name=f"model={m}_parallel={n}", params={"model": f"Qwen3.6-35B-A3B-{m}.gguf", "parallel": str(n)}, runs_ok=3,
        runs=3, failure=None, single_stream_tok_s=MeanSd(3, 12345.6, 234.5), peak_tok_s=MeanSd(3, 98765.4, 1234.5),
        peak_at=64, saturated_at=32,
        latency_by_level={lv: MeanSd(3, 123456.7 / lv, 1234.5) for lv in (1, 2, 4, 8, 16, 32, 64)},
        kv_logged_mib=2560.0, kv_estimate_mib=2560.0, n_slots=n, kv_unified=False)
        for m in ("Q4_K_M", "Q8_0") for n in (1, 4)]
    return grid_table(cells, ["model", "parallel"])


def every_grid() -> list[tuple[str, Grid]]:
    docs = {name: load_run_dict(DATA / name) for name in GOLDEN}
    docs |= {"prefill": prefill_doc(), "depth": depth_doc(), "soak": soak_doc()}
    docs |= {f"{name} (wide)": widened(doc) for name, doc in list(docs.items())}
    grids = [(f"{name}: {g.title}", g) for name, doc in docs.items() for g in run_grids(doc)]
    return grids + [("compare", comparison_grid()), ("grid", grid_summary_grid())]


def rendered(grid: Grid, width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    for table in rich_tables(grid, width):
        console.print(table)
    return out.getvalue()


def cut_cells(grid: Grid, text: str) -> list[str]:
    """The cells that do not appear whole on a line of the output (a wrapping note: by word)."""
    lines = text.splitlines()
    missing = []
    for row in grid.rows:
        for column, cell in zip(grid.columns, row):
            value = text_of(cell)
            parts = value.split() if column.wrap else [value]
            missing += [part for part in parts if part and not any(part in line for line in lines)]
    return missing


GRIDS = every_grid()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name, grid", GRIDS, ids=[name for name, _ in GRIDS])
def test_no_table_cuts_a_figure(name, grid, width):
    text = rendered(grid, width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text.replace("SmolLM2-135M…Q4_1", "")  # rich's mark of a cut cell
    assert cut_cells(grid, text) == []


def test_the_wide_tables_really_are_wide():
    """The check above means something: the wide sweep is split at 80 columns, and its numbers are big."""
    name, grid = next((n, g) for n, g in GRIDS if n == "sweep-smollm2 (wide): loadgen sweep")
    assert len(rich_tables(grid, 80)) >= 2
    assert len(rich_tables(grid, 200)) == 1
    figures = [str(c) for row in grid.rows for c in row if isinstance(c, Num) and c.value is not None]
    assert any(len(f) >= 9 for f in figures), figures  # e.g. 2,257,000


def test_a_split_table_names_its_rows_in_every_part():
    _, grid = next((n, g) for n, g in GRIDS if n == "sweep-sim-v2 (wide): loadgen sweep")
    parts = rich_tables(grid, 80)
    assert len(parts) >= 2
    for part in parts:
        assert [c.header for c in part.columns][:2] == ["C", "target"]
    assert parts[1].title.endswith("(continued)")


def test_the_check_finds_the_cuts_a_plain_rich_table_makes():
    """The same wide sweep handed to rich as one table (what loadgen drew before) loses figures at 120."""
    from rich.table import Table

    _, grid = next((n, g) for n, g in GRIDS if n == "sweep-smollm2 (wide): loadgen sweep")
    table = Table(title=grid.title)
    for column in grid.columns:
        table.add_column(column.title, justify=column.justify)
    for row in grid.rows:
        table.add_row(*map(text_of, row))
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(table)
    assert cut_cells(grid, out.getvalue())


@pytest.mark.parametrize("columns, width", [("80", 80), ("100", 100), (None, 120)])
def test_piped_output_is_as_wide_as_columns_says(columns, width):
    """Piped into a file, the tables take COLUMNS (120 without it); before, they were 180 whatever it said."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "analyze", str(DATA / "sweep-smollm2")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table_lines = [line for line in proc.stdout.splitlines() if line[:1] in "┏┃┡│├└"]
    assert table_lines and max(len(line) for line in table_lines) <= width
    assert max(len(line) for line in table_lines) > width - 25  # the width is used, not a narrow default


@pytest.mark.parametrize("fmt", ["json", "csv", "markdown"])
def test_machine_formats_hold_no_box_drawing_and_name_every_row(fmt, loadgen):
    code, out, err = loadgen("analyze", DATA / "sweep-sim-v2", "--format", fmt)
    assert code == 0, err
    assert not any(ch in out for ch in "┏┃━│─")
    if fmt == "json":
        import json

        doc = json.loads(out)
        sweep = doc["tables"][0]
        assert sweep["columns"][:2] == ["C", "target"] and all(row[1] == "sim" for row in sweep["rows"])
        assert isinstance(sweep["rows"][0][sweep["columns"].index("tok/s")], float) and doc["verdicts"]
    elif fmt == "csv":
        import csv

        block = out.split("\n\n")[0].splitlines()
        assert block[0] == "# loadgen sweep"
        rows = list(csv.reader(block[1:]))
        assert rows[0][:2] == ["C", "target"] and [r[0] for r in rows[1:]] == ["1", "2"]
        assert all(r[1] == "sim" for r in rows[1:])
