"""`loadgen grid --measure cache-capacity`: each cell's `loadgen cache-capacity` against its own server
(given the server's pid and the cell's --cache-ram), its result typed in grid.json, the warm
conversations each cell holds beside the prediction, and the best cell named by the capacity rules;
`held_answer`'s rule on a table of cases.

The grid runs the stand-in server (tests/fake-llama-server.py: the simulator, whose `--cache-ram MIB` is a
host prompt cache of MIB × 2²⁰ / 23,040 tokens) over --parallel 1,2 × --cache-ram 0,12."""

from __future__ import annotations

import json
import math

import msgspec
import pytest

from loadgen.analysis.grid_capacity import BEST, HELD, RunAnswer, best_cell, cell_held, held_answer
from loadgen.core.griddoc import CacheCapacityEntry, CacheCapacityLevelEntry, GridRun
from servers import GRID_SERVER, grid, grid_pids

RATIO = 101 / 164  # a warm turn that reuses BOS + the 100-token prefix of its 164-token prompt

# (parallel, cache_ram MiB) -> (warm conversations held, predicted), written before the run from the
# simulator's rules (sim/scheduler.py, sim/host_cache.py; docs/cache.md's table). Conversations of
# 100 + 64 = 164 tokens, an entry of 164 + 3 answer tokens = 167; 12 MiB = 546 tokens: C = 3 entries.
# - No host cache: a slot per conversation; K = S + 1 round-robin over LRU slots takes the slot of
#   the conversation needed next, so none hits: held = S.
# - One slot: it saves its conversation before the next is restored, and the one needed next is the
#   oldest entry, evicted first: S + C - 1 = 3.
# - Two slots, idle slots saved (the simulator's default, as llama-server's): the cache holds every
#   conversation but the one just served, the idle slot's copy among them: max(S, C + 1) = 4.
# The prediction (analysis/cache.py, from --bytes-per-token 23,040 and 12 MiB: entries of 167 cells
# × 23,052 bytes + a header, C = 3) says the same; the collapse is at held + 1.
EXPECTED = {("1", "0"): (1, 1), ("1", "12"): (3, 3), ("2", "0"): (2, 2), ("2", "12"): (4, 4)}


@pytest.fixture(scope="module")
def cache_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("cachegrid") / "grid"
    proc = grid("--server", f"{GRID_SERVER} --parallel {{parallel}} --cache-ram {{cache_ram}}",
                "--param", "parallel=1,2", "--param", "cache_ram=0,12", "--repeat", "2",
                "--measure", "cache-capacity", "--conversation-tokens", "100", "--k", "1,2,3,4,5", "--rounds", "3",
                "--bytes-per-token", "23040", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_each_cell_holds_what_the_simulator_keeps_warm(cache_grid):
    out, proc = cache_grid
    cells = json.loads((out / "grid.json").read_text())["cells"]
    assert len(cells) == 4
    for cell in cells:
        held, predicted = EXPECTED[cell["params"]["parallel"], cell["params"]["cache_ram"]]
        assert [r["status"] for r in cell["runs"]] == ["ok", "ok"], [r.get("reason") for r in cell["runs"]]
        for run in cell["runs"]:
            result = msgspec.convert(run["cache_capacity"], CacheCapacityEntry)  # typed in grid.json
            assert result.slots == int(cell["params"]["parallel"])
            assert result.cache_ram_mib == float(cell["params"]["cache_ram"])  # the cell's --cache-ram
            assert (result.collapse_k, result.predicted_capacity) == (held + 1, predicted), result
            # BOS + the prefix, and at most one more token a request: the salt after the prefix may
            # start with the same token as the cached turn's salt by chance (a shared lead of two
            # tokens is about one in a million).
            warm = [lv.warm_hit_ratio for lv in result.levels if lv.k <= held]
            assert len(warm) == held and all(RATIO - 1e-9 <= r <= RATIO + 1 / 164 for r in warm), result
            assert all(lv.rss_mib and lv.rss_mib > 0 for lv in result.levels), result  # --server-pid: the cell's
            assert (out / run["run_dir"] / "cache-capacity.json").is_file()
    # each server was seen gone when its cell ended (a later pid_alive check can meet a reused pid on a
    # busy machine with a small pid_max, 32,768 by default)
    assert all(r["server_gone"] for c in cells for r in c["runs"]) and len(grid_pids(out)) == 8
    assert ("parallel=2 cache_ram=12 holds 4 warm conversations, the next best (parallel=1 cache_ram=12) "
            "3 warm conversations; lead outside the noise") in proc.stdout, proc.stdout
    assert "4 ± 0 (4, 4)" in proc.stdout and "1 ± 0 (1, 1)" in proc.stdout


def test_analyze_prints_the_grid_again(cache_grid, loadgen):
    out, proc = cache_grid
    code, stdout, err = loadgen("analyze", out)
    assert code == 0, err
    assert "warm conversations" in stdout and "lead outside the noise" in stdout
    code, stdout, err = loadgen("analyze", out / "cells" / "c04" / "r1")  # a cell's run: its table per K
    assert code == 0 and "reuse collapsed at K = 5" in stdout and "predicted: 4" in stdout, err


@pytest.mark.parametrize("args", [("--server-pid", "1"), ("--cache-ram-mib=8",), ("--kv-unified",)])
def test_what_grid_sets_per_cell_is_refused_in_one_line(loadgen, tmp_path, args):
    code, _, err = loadgen("grid", "--server", "llama-server -np {p}", "--param", "p=1,2",
                           "--measure", "cache-capacity", *args, "--output", tmp_path / "g")
    assert code == 2 and "is set by grid for every cell" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "g").exists()


def _result(ratios: dict[int, float | None], collapse: int | None) -> CacheCapacityEntry:
    return CacheCapacityEntry(conversation_tokens=164, rounds=3, slots=2, collapse_k=collapse,
                              levels=[CacheCapacityLevelEntry(k=k, warm_hit_ratio=r) for k, r in ratios.items()])


# (warm hit ratio per K, collapse K) -> the run's answer [low, upper], written before running:
# a collapse at K: the largest K measured below it .. K - 1; none: the largest K .. ∞; nothing
# reused at any K: 0 .. the smallest K - 1; no K measured: no answer.
HELD_CASES = [
    (({1: 0.6, 2: 0.6, 3: 0.0}, 3), RunAnswer(2, 2)),
    (({1: 0.6, 2: 0.6, 4: 0.1}, 4), RunAnswer(2, 3)),
    (({1: 0.6, 2: 0.6, 4: 0.6}, None), RunAnswer(4, math.inf)),
    (({1: 0.0, 2: None}, None), RunAnswer(0, 0)),
    (({2: 0.0, 4: 0.0}, None), RunAnswer(0, 1)),
    (({}, None), None),
]


@pytest.mark.parametrize("result,expected", HELD_CASES)
def test_how_many_conversations_a_run_found_warm(result, expected):
    assert held_answer(_result(*result)) == expected


def test_the_best_cell_by_warm_conversations_needs_repeats_outside_the_spread():
    three, two = _result({1: 0.6, 2: 0.6, 3: 0.6, 4: 0.0}, 4), _result({1: 0.6, 2: 0.6, 3: 0.0}, 3)
    verdict = best_cell([cell_held("a", [three, three]), cell_held("b", [two, two])])
    assert verdict.kind == BEST and verdict.sentence.startswith("a holds 3 warm conversations")
    assert cell_held("a", [three]).by == HELD
    # one repeat of b reaching a's floor: a tie
    assert best_cell([cell_held("a", [three, three]), cell_held("b", [two, three])]).kind == "tie"
    # one run per cell: the lead is untested
    assert best_cell([cell_held("a", [three]), cell_held("b", [two])]).kind == "untested"


def test_a_grid_run_without_cache_capacity_reads_as_before():
    """The field is optional: an older grid.json's run has none, and writing one leaves it out."""
    run = msgspec.convert({"repeat": 1, "status": "ok"}, GridRun)
    assert run.cache_capacity is None and "cache_capacity" not in msgspec.to_builtins(run)


# (the cell's server argv) -> what grid adds to its cache-capacity run (server pid 7), written first:
# the pid always; --cache-ram's MiB when set; the modes the prediction needs from the command line
# (llama-server's KV cache is unified when no --parallel is given).
CELL_ARGS = [
    (["llama-server", "--parallel", "2", "--cache-ram", "12"], ["--server-pid", "7", "--cache-ram-mib", "12"]),
    (["llama-server", "-np", "2", "-cram", "0", "--no-cache-idle-slots"],
     ["--server-pid", "7", "--cache-ram-mib", "0", "--no-cache-idle-slots"]),
    (["llama-server", "-m", "x.gguf"], ["--server-pid", "7", "--kv-unified"]),
    (["llama-server", "-np", "4", "-kvu", "--cache-ram=64"], ["--server-pid", "7", "--cache-ram-mib", "64", "--kv-unified"]),
]


@pytest.mark.parametrize("argv,expected", CELL_ARGS)
def test_what_grid_gives_each_cells_cache_capacity_run(argv, expected):
    from loadgen.cli.grid import cell_measure_args
    assert cell_measure_args("cache-capacity", argv, 7) == expected
    assert cell_measure_args("sweep", argv, 7) == []
