"""`loadgen crossover` over a real `loadgen grid --repeat 2` of the stand-in server (two cells that
differ in one parameter), and its one-line errors."""

from __future__ import annotations

import json

import pytest

from servers import GRID_SERVER, grid


@pytest.fixture(scope="module")
def two_cell_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("xgrid") / "grid"
    proc = grid("--server", f"{GRID_SERVER} {{spec}}", "--param", "spec=--seed=1,--seed=2", "--repeat", "2",
                "--concurrency", "1,2", "--requests", "4", "--n-predict", "8", "--warmup", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_crossover_reads_both_cells_paired_by_repeat_and_prints_json(two_cell_grid, loadgen):
    code, stdout, err = loadgen("crossover", str(two_cell_grid), "--param", "spec", "--on", "--seed=2",
                                "--off", "--seed=1", "--format", "json")
    assert code == 0, err
    doc = json.loads(stdout)
    assert [lv["level"] for lv in doc["levels"]] == [1, 2]
    assert all(lv["repeats"] == 2 and lv["verdict"] in ("pays", "costs", "inconclusive") for lv in doc["levels"])
    assert doc["verdict"].startswith("speculation ") or doc["verdict"].startswith("no clear crossover")
    code, stdout, _ = loadgen("crossover", str(two_cell_grid), "--param", "spec", "--on", "--seed=2",
                              "--off", "--seed=1")
    assert code == 0 and "c=1:" in stdout and "c=2:" in stdout
    # the question is kept in the grid's folder; `analyze GRID` asks it again of the runs: the same lines
    assert json.loads((two_cell_grid / "crossover.json").read_text())["param"] == "spec"
    code, again, err = loadgen("analyze", str(two_cell_grid))
    assert code == 0, err
    tail = again.splitlines()[-len(stdout.splitlines()):]
    assert tail == stdout.splitlines(), again
    assert "crossover of spec: --seed=2 (on) vs --seed=1 (off)" in again


@pytest.mark.parametrize("args,message", [
    (("--param", "nope", "--on", "a", "--off", "b"), "--param 'nope': the grid's parameters are spec"),
    (("--param", "spec", "--on", "x", "--off", "--seed=1"), "no cell of this grid has spec=x"),
    (("--param", "spec", "--on", "--seed=1", "--off", "--seed=1"), "--on and --off name the same value"),
])
def test_crossover_errors_are_one_line(two_cell_grid, loadgen, args, message):
    code, _, err = loadgen("crossover", str(two_cell_grid), *args)
    assert code == 2 and message in err and "Traceback" not in err
