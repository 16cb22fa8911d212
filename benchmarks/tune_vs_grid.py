#!/usr/bin/env python3
"""`loadgen tune` against `loadgen grid --measure capacity` over the same spaces: the same winner, and
the server time each used (issue 48's criterion: tune's winner is the grid's best cell, or a tie that
includes it, in at most 40% of the grid's server-seconds).

The server is the tests' stand-in llama-server (tests/fake-llama-server.py: the simulator behind
llama-server's flags), on which a cell's capacity is known before anything runs: a cell with N slots
serves N users within ttft <= 150 ms (a waiting request's TTFT is a whole answer, tests/servers.py
CAPACITY_SIM), up to --max-concurrency 8; `-fa bogus` is refused at boot; a slot holds -c // parallel
tokens, so a prompt and answer longer than that fail. The spaces, each with its best cell written down
first:

    boot-failures   parallel=1..6 x fa=on,bogus (12 cells, 6 refused at boot)    best parallel=6 fa=on
    context-bound   -c 420, parallel=1..8 (8 cells; 96-token requests overflow
                    a slot from parallel=5 on)                                     best parallel=4
    wide            parallel=1..8 x seed=1,2 (16 cells; the seed changes nothing)  best: parallel=8, a tie
                                                                                  of its two seed cells

The grid runs each cell `--repeat 2` (the evidence tune's final has: two full capacity searches per
finalist), tune its defaults (a 40-request screen, 2 finalists, 2 final repeats). Server seconds are
the sums of every server's lifetime, as both write them. Figures are printed, never asserted.

    python benchmarks/tune_vs_grid.py [--spaces boot-failures,context-bound,wide] [--keep DIR] [--only grid|tune]

(`--only grid --keep DIR`, then `--only tune --keep DIR`: the grids once, the tunes against them.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' one helper module for the servers they start
from loadgen.analysis.tune_plan import seconds_between  # noqa: E402
from servers import CAPACITY_SIM, GRID_SERVER, LOADGEN  # noqa: E402

MEASURE = ("--stream", "--slo", "ttft=150ms", "--n-predict", "16", "--prompt-tokens", "80", "--warmup", "1",
           "--max-concurrency", "8")
SPACES = {
    "boot-failures": ("--parallel {parallel} -fa {fa}", ("parallel=1,2,3,4,5,6", "fa=on,bogus"),
                      {"parallel": "6", "fa": "on"}),
    "context-bound": ("--parallel {parallel} -c 420", ("parallel=1,2,3,4,5,6,7,8",), {"parallel": "4"}),
    "wide": ("--parallel {parallel} --seed {seed}", ("parallel=1,2,3,4,5,6,7,8", "seed=1,2"),
             {"parallel": "8", "seed": "1"}),
}


def grid_seconds(folder: Path) -> tuple[float, list[dict]]:
    doc = json.loads((folder / "grid.json").read_text())
    seconds = sum(seconds_between(r.get("started_utc"), r.get("finished_utc")) for c in doc["cells"] for r in c["runs"])
    return seconds, doc["cells"]


def best_cells(cells: list[dict]) -> tuple[set[str], str]:
    """The cells whose capacity (mean low over their runs) is highest: grid's truth for this benchmark."""
    means = {}
    for c in cells:
        lows = [r["capacity"].get("feasible_max") or 0 for r in c["runs"] if r.get("status") == "ok" and r.get("capacity")]
        if lows:
            means[c["name"]] = sum(lows) / len(lows)
    top = max(means.values())
    return {n for n, m in means.items() if m == top}, ", ".join(f"{n}: {m:g}" for n, m in sorted(means.items()))


def run(args: list[str], timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, *args], capture_output=True, text=True, timeout=timeout)


def one_space(name: str, root: Path, profile: Path, only: str, reverse: bool = False) -> None:
    flags, params, truth = SPACES[name]
    if reverse and only == "tune":  # the values listed best guess first (the largest first): the screen's bar
        params = tuple(f"{p.split('=')[0]}={','.join(reversed(p.split('=')[1].split(',')))}" for p in params)
    template = f"{GRID_SERVER} {flags} --profile {profile} --time-scale 1"
    param_args = [a for p in params for a in ("--param", p)]
    started = time.monotonic()
    grid = run(["grid", "--server", template, *param_args, "--measure", "capacity", "--repeat", "2",
                "--output", str(root / f"{name}-grid"), *MEASURE]) if only != "tune" else None
    grid_wall = time.monotonic() - started
    if grid is not None and (grid.returncode not in (0, 1) or not (root / f"{name}-grid" / "grid.json").is_file()):
        print(f"{name}: grid failed ({grid.returncode}): {grid.stderr[-800:]}")
        return
    if only == "grid":
        print(f"{name}: grid {grid_seconds(root / f'{name}-grid')[0]:.1f} server s, wall {grid_wall:.0f} s", flush=True)
        return
    started = time.monotonic()
    tune = run(["tune", "--server", template, *param_args, "--screen-budget", "40", "--output",
                str(root / f"{name}-tune{'-rev' if reverse else ''}"), "--force", *MEASURE])
    tune_wall = time.monotonic() - started
    if tune.returncode != 0:
        print(f"{name}: tune failed ({tune.returncode}): {tune.stderr[-800:]}")
        return
    g_seconds, cells = grid_seconds(root / f"{name}-grid")
    best, means = best_cells(cells)
    doc = json.loads((root / f"{name}-tune{'-rev' if reverse else ''}" / "tune.json").read_text())
    winner = doc["winner"]["params"] if doc.get("winner") else None
    named = {c["name"] for c in doc["cells"] if c["status"] == "winner"} | set(doc.get("tied_with") or [])
    agrees = bool(named & best) if doc.get("tie") else (winner is not None and
                                                        " ".join(f"{k}={v}" for k, v in winner.items()) in best)
    truth_name = " ".join(f"{k}={v}" for k, v in truth.items())
    print(f"{name}: {len(cells)} cells; truth {truth_name}; grid's best {sorted(best)} ({means})")
    print(f"  tune: {'tie ' + str(doc.get('tied_with')) if doc.get('tie') else 'winner ' + str(winner)}; "
          f"agrees with the grid: {agrees}")
    print(f"  server seconds: tune {doc['server_seconds']:.1f}, grid {g_seconds:.1f}, ratio "
          f"{doc['server_seconds'] / g_seconds:.2f}; wall: tune {tune_wall:.0f} s, grid {grid_wall:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", default=",".join(SPACES))
    parser.add_argument("--reverse", action="store_true",
                        help="With --only tune: each --param's values in reverse (largest first), as a user who lists "
                             "the values expected best first gives them (the screen's bar drops more).")
    parser.add_argument("--keep", help="Write the grids and tunes here (default: a temporary folder, removed).")
    parser.add_argument("--only", choices=("grid", "tune", "both"), default="both",
                        help="grid: run the grids only; tune: run the tunes against the grids already in --keep.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        profile = root / "capsim.toml"
        profile.write_text(CAPACITY_SIM)
        for name in args.spaces.split(","):
            one_space(name, root, profile, args.only, args.reverse)


if __name__ == "__main__":
    main()
