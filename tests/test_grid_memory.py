"""`grid --memory`: a cell whose weights and KV cache cannot fit is dropped before its server starts
(issue 48's first step: feasible first, for free). The rule on a table written down before the code
ran, then a grid of the stand-in server over a metadata-only GGUF of SmolLM2-135M's shape."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.kv import does_not_fit
from loadgen.core.processes import pid_alive
from servers import GRID_SERVER, grid, grid_pids
from test_kv import SMOLLM2, write_gguf


@pytest.mark.parametrize("weights, cache, memory, dropped", [
    (100.0, 45.0, 1024.0, False),
    (100.0, 924.0, 1024.0, False),   # exactly the memory: fits
    (100.0, 924.5, 1024.0, True),
    (0.0, 180.0, 100.0, True),
    (None, 180.0, 100.0, False),     # weights unknown: nothing claimed
    (100.0, None, 100.0, False),     # no estimate (not llama-server, no -m): nothing claimed
])
def test_a_cell_is_dropped_only_when_weights_and_cache_alone_exceed_the_memory(weights, cache, memory, dropped):
    reason = does_not_fit(weights, cache, memory)
    assert (reason is not None) == dropped
    if dropped:
        assert f"--memory {memory:,.0f} MiB" in reason and "not started" in reason


def test_grid_drops_a_cell_that_cannot_fit_before_starting_its_server(tmp_path):
    model = write_gguf(tmp_path / "smollm2-shape.gguf", SMOLLM2)  # 22.5 KiB of KV a token, no weights
    out = tmp_path / "grid"
    # -c 2048: 45 MiB of KV, fits 100 MiB; -c 8192: 180 MiB, does not
    proc = grid("--server", f"{GRID_SERVER} -m {model} -c {{ctx}}", "--param", "ctx=2048,8192",
                "--memory", "100MiB", "--concurrency", "1", "--requests", "4", "--n-predict", "4",
                "--output", str(out))
    assert proc.returncode == 0, proc.stderr  # a dropped cell is a decision, not a failure
    doc = json.loads((out / "grid.json").read_text())
    runs = {c["params"]["ctx"]: c["runs"][0] for c in doc["cells"]}
    assert runs["2048"]["status"] == "ok", runs["2048"]
    assert runs["8192"]["status"] == "infeasible", runs["8192"]
    assert "needs at least 180 MiB" in runs["8192"]["reason"], runs["8192"]["reason"]
    assert "pid" not in runs["8192"] and not (out / "cells" / "c02" / "r1" / "server.log").exists()
    assert doc["memory_mib"] == 100
    assert "infeasible" in proc.stdout + proc.stderr
    assert not any(pid_alive(p) for p in grid_pids(out))  # no server left behind


def test_a_cell_without_an_estimate_is_started_and_said_to_be_unfiltered(tmp_path):
    out = tmp_path / "grid"
    proc = grid("--server", f"{GRID_SERVER} -c {{ctx}}", "--param", "ctx=2048", "--memory", "100MiB",
                "--concurrency", "1", "--requests", "2", "--n-predict", "4", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "--memory not applied to this cell" in proc.stderr, proc.stderr
    assert json.loads((out / "grid.json").read_text())["cells"][0]["runs"][0]["status"] == "ok"


def test_without_memory_a_metal_grid_takes_the_working_set_of_its_first_boot_log(tmp_path):
    model = write_gguf(tmp_path / "smollm2-shape.gguf", SMOLLM2)
    out = tmp_path / "grid"
    # 150 MB (10^6 bytes) = 143.05 MiB: -c 2048 (45 MiB of KV) boots first and says so; -c 8192 (180 MiB) does not fit
    proc = grid("--server", f"{GRID_SERVER} -m {model} -c {{ctx}} --metal-working-set 150", "--param", "ctx=2048,8192",
                "--concurrency", "1", "--requests", "4", "--n-predict", "4", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "grid.json").read_text())
    runs = {c["params"]["ctx"]: c["runs"][0] for c in doc["cells"]}
    assert runs["2048"]["status"] == "ok" and runs["2048"]["boot"]["metal"] == {
        "name": "Apple M1 Max", "gpu_families": ["MTLGPUFamilyApple7"], "unified_memory": True,
        "working_set_mib": 143.05}
    assert runs["8192"]["status"] == "infeasible", runs["8192"]
    assert "more than the Metal working set 143 MiB: not started" in runs["8192"]["reason"], runs["8192"]["reason"]
    assert doc["memory_mib"] is None  # --memory was not given: the grid says where its budget came from instead
    said = [line for line in proc.stderr.splitlines() if "no --memory" in line]
    assert [line.strip() for line in said] == ["no --memory: the Metal working set of this boot log, 143.05 MiB "
                                               "(recommendedMaxWorkingSetSize), is the budget of the cells after it"]
    assert not any(pid_alive(p) for p in grid_pids(out))
