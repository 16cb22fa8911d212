"""A new user's grid, end to end (issue 39): every measurement's own table and summary, short cell
names, and cells that compare, gate, calibrate and export find and accept. Against the stand-in
server (tests/fake-llama-server.py); expected outputs written before the code that gives them."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.grid_cells import cell_names
from servers import GRID_SERVER, grid

PREFILL = ("--measure", "prefill", "--prompt-tokens", "64,256", "--repeat", "1")


@pytest.fixture(scope="module")
def prefill_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("g") / "prefill"
    proc = grid("--server", f"{GRID_SERVER} --parallel {{parallel}}", "--param", "parallel=1,2", *PREFILL,
                "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.fixture(scope="module")
def sweep_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("g") / "sweep"
    proc = grid("--server", f"{GRID_SERVER} --parallel {{parallel}}", "--param", "parallel=1,2", "--repeat", "3",
                "--concurrency", "1,2", "--requests", "4", "--n-predict", "8", "--warmup", "0",
                "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_prefill_grid_has_its_own_table_and_summary(prefill_grid):
    """Before: "ok: no levels" per cell and every column n/a. After: prompt tok/s and TTFT per length."""
    _, proc = prefill_grid
    assert "no levels" not in proc.stderr
    assert "ok: prompt tok/s" in proc.stderr  # the cell's one-line summary names its measurement
    table = proc.stdout
    assert "loadgen grid (prefill)" in table and "TTFT" in table and "177" not in table.split("runs ok")[0]
    assert all(n not in table for n in ("n/a │", "n/a ┃"))
    assert "peak tok/s" not in table and "saturated" not in table  # the sweep's columns are not a prefill's
    assert "highest prompt tok/s at 256 tokens: parallel=" in table
    assert "lowest TTFT at 256 tokens (ms): parallel=" in table


def test_depth_grid_has_its_own_table_and_summary(tmp_path):
    out = tmp_path / "depth"
    proc = grid("--server", f"{GRID_SERVER} --parallel {{parallel}}", "--param", "parallel=1,2", "--measure", "depth",
                "--depths", "0,128", "--repeat", "1", "--n-predict", "8", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "no levels" not in proc.stderr and "ok: decode tok/s" in proc.stderr
    assert "decode tok/s" in proc.stdout and "peak tok/s" not in proc.stdout
    assert "highest decode tok/s at depth 128" in proc.stdout


# values of one parameter -> the cell names: a path by its file's stem, unless two stems are the same
CELL_NAMES = [
    ([{"model": "/opt/models/SmolLM2-135M.Q4_1.gguf", "parallel": "1"}],
     ["model=SmolLM2-135M.Q4_1 parallel=1"]),
    ([{"model": "a/x.gguf"}, {"model": "b/y.gguf"}], ["model=x", "model=y"]),
    ([{"model": "a/x.gguf"}, {"model": "b/x.gguf"}], ["model=a/x.gguf", "model=b/x.gguf"]),  # stems collide
    ([{"ctk": "q8_0"}], ["ctk=q8_0"]),
    ([{}], ["server"]),
]


@pytest.mark.parametrize("cells, expected", CELL_NAMES)
def test_cell_names_are_short(cells, expected):
    assert cell_names(cells) == expected


def test_cells_of_one_grid_compare_and_gate(sweep_grid, loadgen):
    """Before: "the runs share no target label"; `compare grid/cells/c01 ...` "no run.json in it"."""
    out, _ = sweep_grid
    code, stdout, err = loadgen("compare", out / "cells" / "c01", out / "cells" / "c02")
    assert code == 0, err
    code, stdout, err = loadgen("compare", out / "c01", out / "c02")  # a cell by id under the grid folder
    assert code == 0, err
    code, _, err = loadgen("gate", out / "cells" / "c01" / "r1" / "run", out / "cells" / "c02" / "r1" / "run")
    assert "share no target label" not in err and code != 2, err


def test_calibrate_a_cell(sweep_grid, loadgen, tmp_path):
    out, _ = sweep_grid
    code, stdout, err = loadgen("calibrate", out / "cells" / "c01", "--out", tmp_path / "noise.json")
    assert code == 0, err
    assert (tmp_path / "noise.json").is_file()


def test_a_grid_where_a_run_is_expected_names_its_cells(sweep_grid, loadgen, tmp_path):
    out, _ = sweep_grid
    code, _, err = loadgen("export", out, "--format", "json", "--out", tmp_path / "x")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is a grid" in err and f"{out}/c01 (parallel=1)" in err
    code, _, err = loadgen("export", out / "c02", "--format", "json", "--out", tmp_path / "y")
    assert code == 2 and "3 runs" in err, err  # a cell with repeats: name the run
    code, stdout, err = loadgen("export", out / "cells" / "c02" / "r2", "--format", "json", "--out", tmp_path / "z")
    assert code == 0, err
    doc = json.loads((tmp_path / "z" / "levels.json").read_text())
    assert doc


def test_grid_cells_share_one_label(sweep_grid):
    out, _ = sweep_grid
    labels = {json.loads((p / "run.json").read_text())["targets"][0]["label"]
              for p in out.glob("cells/*/r*/run")}
    assert labels == {"server"}


def _doc(url, slots=2):
    return {"kind": "sweep", "config": {"n_predict": 8},
            "targets": [{"label": "server", "url": url, "server": {"total_slots": slots}}]}


# (first run, other run, restarted) -> the field that differs: a grid cell's repeats are one
# configuration on a port picked again each time, but a server that says otherwise still differs
RESTARTED = [
    (_doc("http://127.0.0.1:1"), _doc("http://127.0.0.1:2"), False, "server's url"),
    (_doc("http://127.0.0.1:1"), _doc("http://127.0.0.1:2"), True, None),
    (_doc("http://127.0.0.1:1"), _doc("http://127.0.0.1:2", slots=4), True, "server's server total_slots"),
]


@pytest.mark.parametrize("a, b, restarted, expected", RESTARTED)
def test_calibrate_a_restarted_server(a, b, restarted, expected):
    from loadgen.analysis.run_identity import first_difference

    found = first_difference([("r1", a), ("r2", b)], restarted=restarted)
    assert (found.field if found else None) == expected


def test_resume_refuses_options_it_would_ignore(prefill_grid, loadgen):
    """Before: `grid --resume DIR --concurrency 4` ignored --concurrency silently."""
    out, _ = prefill_grid
    code, _, err = loadgen("grid", "--resume", out, "--concurrency", "4")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "leave out --concurrency 4" in err
    code, _, err = loadgen("grid", "--resume", out, "--repeat", "3")
    assert code == 2 and "leave out --repeat" in err, err


# a return code -> how the grid says the measurement ended (before: "sweep exited with -9")
ENDED = [
    (1, "sweep exited with code 1"),
    (-9, "sweep was killed by SIGKILL (out of memory?)"),
    (-15, "sweep was killed by SIGTERM"),
]


@pytest.mark.parametrize("code, expected", ENDED)
def test_how_a_measurement_ended(code, expected):
    from loadgen.cli.grid import ended

    assert ended("sweep", code) == expected


def test_the_log_tail_leaves_out_the_exit_memory_table():
    from loadgen.analysis.bootlog import log_tail

    log = ("srv  update_slots: all slots are idle\nGGML_ASSERT: something failed\n"
           "llama_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context |\n"
           "llama_memory_breakdown_print: |   - Host               |                  135 =    72 +      45 |\n")
    assert log_tail(log, 1) == ["GGML_ASSERT: something failed"]


def _scenario(tmp_path, extra):
    path = tmp_path / "grid.toml"
    path.write_text(f'mode = "grid"\nserver = "{GRID_SERVER} --parallel {{parallel}}"\nparam = ["parallel=1,2"]\n'
                    f'concurrency = [1, 2]\nrequests = 4\n{extra}\n')
    return path


def test_a_grid_scenarios_errors_name_the_grid_and_the_file(tmp_path, loadgen):
    """Before: "unknown key for mode 'sweep'", and a cross-key error without the file's name."""
    path = _scenario(tmp_path, "n_predikt = 3")
    code, _, err = loadgen("run", path, "--check")
    assert code == 2 and f"{path}:6: n_predikt: unknown key for mode 'grid'" in err and "n_predict" in err, err
    path = _scenario(tmp_path, "duration = 5")
    code, _, err = loadgen("run", path, "--check")
    assert code == 2 and err.startswith(f"loadgen: error: {path}: give --requests"), err


def test_analyze_and_report_take_a_cell(prefill_grid, sweep_grid, loadgen):
    out, _ = prefill_grid
    code, stdout, err = loadgen("analyze", out / "c01")
    assert code == 0 and "prompt" in stdout, err
    out, _ = sweep_grid
    code, stdout, err = loadgen("report", out / "c02", "--format", "markdown")
    assert code == 0 and "## c02 r1: server" in stdout and "## c02 r3: server" in stdout, err


def test_the_grid_table_shows_short_values():
    """Before: the model column held the whole cache path (66 characters)."""
    from rich.console import Console

    from loadgen.analysis.grid_cells import summarize_cell
    from loadgen.output.grid_table import print_grid

    cells = [summarize_cell(name, params, [])
             for params, name in zip(*(lambda ps: (ps, cell_names(ps)))([{"model": "/opt/m/SmolLM2.Q4_1.gguf"}]))]
    console = Console(width=120, record=True)
    print_grid(console, {"params": [{"name": "model"}], "measure": "sweep"}, cells)
    text = console.export_text()
    assert "SmolLM2.Q4_1" in text and "/opt/m" not in text
