"""What does `loadgen capacity` cost against an exhaustive sweep, and does it find the same answer? (issue 34)

On simulators with known slot counts (`loadgen sim`, a 20 ms decode step, so a request that waits
for a slot has a TTFT of a whole answer), for each slot count and each of `--runs` runs: `loadgen
capacity --slo ttft=150ms --stream` up to --max-concurrency, then the exhaustive sweep of every
concurrency from 1 to 2x its answer with the same SLO. Printed per run: both answers (the sweep's
is its highest passing level), both request counts and wall times; then per slot count how many
runs agreed and the totals.

    python benchmarks/capacity.py                       # slots 2 and 4, 3 runs each (~6 min on 2 cores)
    python benchmarks/capacity.py --slots 3 --runs 10
    python benchmarks/capacity.py --real --slots 3 --runs 10   # the test bed's llama-server (scripts/testbed)

`--real` measures the test bed's llama-server (`-c 4096 -t 1`, the slot count given) instead: the
target is a queue wait (latency - prompt_ms - predicted_ms) of half the server's own decode time
at c=1, calibrated before each run (the machine's speed moves with its load), as
tests/test_capacity_real.py does: a request waits for nothing while a slot is free and for a whole
answer once none is, so the answer is the slot count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' one helper module for the servers they start

from servers import CAPACITY_SIM, LOADGEN, SimProcess, start_llama_server  # noqa: E402

COMMON = ("--stream", "--slo", "ttft=150ms", "--n-predict", "16", "--warmup", "1")
REAL = ("--n-predict", "32", "--warmup", "1")


def loadgen(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run([*LOADGEN, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"loadgen {args[0]} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc, time.perf_counter() - start


@contextlib.contextmanager
def server_of(real: bool, slots: int, profile: Path, work: Path) -> Iterator[str]:
    """The URL of a simulator with `slots` slots, or of the test bed's llama-server; stopped after."""
    if not real:
        with SimProcess("--profile", str(profile), "--slots", str(slots)) as sim:
            yield sim.url
        return
    server = start_llama_server("capacity-bench", slots, work)
    try:
        yield server.url
    finally:
        server.stop()


def real_settings(url: str, out: Path) -> tuple[str, ...]:
    """REAL plus a queue target of half the server's decode time at c=1, measured now."""
    loadgen("sweep", "--url", url, *REAL, "--concurrency", "1", "--requests", "4", "--no-histograms",
            "--output", str(out / "c1"))
    c1 = json.loads((out / "c1" / "run.json").read_text())["targets"][0]["levels"][0]
    return (*REAL, "--slo", f"queue={c1['predicted_ms_mean'] / 2:.0f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", default="2,4", help="slot counts of the simulators")
    parser.add_argument("--runs", type=int, default=3, help="runs per slot count")
    parser.add_argument("--max-concurrency", default="32")
    parser.add_argument("--real", action="store_true", help="the test bed's llama-server instead of simulators")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="loadgen-capacity-") as tmp:
        work = Path(tmp)
        profile = work / "capsim.toml"
        profile.write_text(CAPACITY_SIM)
        for slots in (int(s) for s in args.slots.split(",")):
            agree, totals = 0, [0, 0, 0.0, 0.0]
            with server_of(args.real, slots, profile, work) as url:
                for run in range(args.runs):
                    out = work / f"s{slots}-{run}"
                    common = real_settings(url, out) if args.real else COMMON
                    cap, cap_s = loadgen("capacity", "--url", url, *common, "--max-concurrency",
                                         args.max_concurrency, "--format", "json", "--output", str(out / "cap"))
                    result = json.loads(cap.stdout)["capacity"]
                    top = 2 * max(result["feasible_max"] or 1, 1)
                    _, sweep_s = loadgen("sweep", "--url", url, *common, "--concurrency",
                                         ",".join(map(str, range(1, top + 1))), "--no-histograms", "--output",
                                         str(out / "all"))
                    levels = json.loads((out / "all" / "run.json").read_text())["targets"][0]["levels"]
                    swept = max((lv["level"] for lv in levels if lv["slo"]["passed"]), default=None)
                    sweep_requests = sum(lv["requests_ok"] + lv["requests_failed"] for lv in levels)
                    agree += swept == result["feasible_max"]
                    totals = [totals[0] + result["requests"], totals[1] + sweep_requests, totals[2] + cap_s,
                              totals[3] + sweep_s]
                    print(f"slots {slots} run {run + 1}: capacity {result['feasible_max']} "
                          f"({result['requests']} requests, {cap_s:.1f} s, probes "
                          f"{[lv['level'] for lv in result['levels']]}); exhaustive 1..{top}: {swept} "
                          f"({sweep_requests} requests, {sweep_s:.1f} s)", flush=True)
            print(f"slots {slots}: {agree}/{args.runs} runs agree; requests {totals[0]} vs {totals[1]} "
                  f"({totals[0] / totals[1]:.2f}x), wall {totals[2]:.1f} s vs {totals[3]:.1f} s "
                  f"({totals[2] / totals[3]:.2f}x, process start-up included)", flush=True)


if __name__ == "__main__":
    main()
