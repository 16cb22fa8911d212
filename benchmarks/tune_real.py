#!/usr/bin/env python3
"""`loadgen tune` on the real test bed (issue 48's second criterion): a search over llama-server's
`--parallel` × `-ub` × `-ctk` under a TTFT and a TPOT target finishes within `--budget`, names a
winner or a tie with its evidence, and the winner's capacity, measured again on a fresh server with
the same workload and targets, is within what the search reported.

The server is the test bed's (scripts/testbed: llama-server build 11434, SmolLM2-135M Q4_1), one
thread, on loopback ports; every server is tune's (a grid's: started and stopped by pid) or this
script's own (stopped by pid). "Within what the search reported": the fresh search's answer (the
highest level that passed) lies in the span of the winner's final runs' answers, each widened by
capacity's --noise (10%) and one level either way (a capacity search's levels are whole users).
Figures are printed, never asserted.

    python benchmarks/tune_real.py [--budget 25m] [--keep DIR] [--repeat 2]
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
from servers import LOADGEN, free_port, testbed_paths, wait_healthy  # noqa: E402

PARAMS = ("parallel=2,4", "ub=128,512", "ctk=f16,q8_0")
CAPACITY = ("--stream", "--slo", "ttft=4s,tpot=300ms", "--prompt-tokens", "64", "--n-predict", "32",
            "--max-concurrency", "8", "--warmup", "1")


def template(binary: str, model: str) -> str:
    return (f"{binary} -m {model} --host 127.0.0.1 --port {{port}} --parallel {{parallel}} -c 2048 -ub {{ub}} "
            "-ctk {ctk} -t 1 --metrics")


def final_answers(tune_dir: Path, params: dict[str, str]) -> list[tuple[int | None, int | None]]:
    """(feasible_max, infeasible_min) of each final run of the cell with `params`."""
    grid = json.loads((tune_dir / "final" / "grid.json").read_text())
    cell = next(c for c in grid["cells"] if c["params"] == params)
    return [(r["capacity"]["feasible_max"], r["capacity"]["infeasible_min"]) for r in cell["runs"] if r.get("capacity")]


def within(again: int | None, answers: list[tuple[int | None, int | None]], noise: float = 0.10) -> bool:
    """The fresh answer in the span of the final runs' answers, widened by the noise and one level."""
    lows = [lo for lo, _ in answers if lo is not None]
    highs = [hi - 1 if hi is not None else lo for lo, hi in answers if lo is not None]
    if again is None or not lows:
        return False
    return min(lows) * (1 - noise) - 1 <= again <= max(highs) * (1 + noise) + 1


def measure_again(binary: str, model: str, params: dict[str, str], out: Path, repeat: int) -> dict:
    """The winner's flags on a fresh server: `loadgen capacity` with the tune's workload and targets."""
    port = free_port()
    argv = template(binary, model).format(port=port, **params).split()
    log = (out / "again-server.log").open("wb")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 120)
        subprocess.run([*LOADGEN, "capacity", "--url", f"http://127.0.0.1:{port}", "--repeat", str(repeat),
                        *CAPACITY, "--output", str(out / "again")], check=False, timeout=3600)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    return json.loads((out / "again" / "capacity.json").read_text())["capacity"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="25m")
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--repeat", type=int, default=2, help="full searches of the winner on the fresh server")
    args = ap.parse_args()
    binary, model = testbed_paths()
    out = args.keep or Path(tempfile.mkdtemp(prefix="tune-real-"))
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tune = subprocess.run([*LOADGEN, "tune", "--server", template(binary, model),
                           *(a for p in PARAMS for a in ("--param", p)), "--budget", args.budget,
                           "--output", str(out / "tune"), "--force", *CAPACITY], check=False, timeout=7200)
    wall = time.monotonic() - started
    doc = json.loads((out / "tune" / "tune.json").read_text())
    print(f"tune exit {tune.returncode}, wall {wall:.0f} s, server time {doc['server_seconds']:.0f} s "
          f"of --budget {doc.get('budget_s')} s; cut: {doc.get('cut')}")
    print(f"answer: {doc['sentence']}")
    for cell in doc["cells"]:
        print(f"  {cell['name']:<28} {cell['status']:<10} screen {cell.get('screen', '-'):<10} "
              f"final {cell.get('final', '-')}  {cell.get('reason') or ''}")
    chosen = doc["winner"]["params"] if doc.get("winner") else None
    if chosen is None and doc.get("tied_with"):  # a tie: the first of the tied cells, by name
        chosen = next((c["params"] for c in doc["cells"] if c["name"] == doc["tied_with"][0]), None)
    if chosen is None:
        print("no winner or tied cell to measure again")
        return
    answers = final_answers(out / "tune", chosen)
    again = measure_again(binary, model, chosen, out, args.repeat)
    print(f"measured again ({chosen}): {again['verdict']}")
    print(f"the final's runs (feasible_max, infeasible_min): {answers}; again: "
          f"{(again['feasible_max'], again['infeasible_min'])}; within the reported spread: "
          f"{within(again['feasible_max'], answers)}")
    print(f"folders: {out}")


if __name__ == "__main__":
    main()
