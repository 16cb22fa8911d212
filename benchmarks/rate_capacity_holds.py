"""Does a rate `loadgen capacity --by rate` answers hold on a long run? (issue 46)

For each slot count and each of `--runs` runs: a simulator (`loadgen sim`, tests/servers.py's
CAPACITY_SIM profile: a 20 ms decode step, 64-token answers of ~1.3 s; `--time-scale` times its
durations), `loadgen capacity --by rate --slo e2e=3s` on it (target and rates scaled with the
simulator's clock), then `--checks` open-loop sweeps at the
answered rate, each `--long` simulated seconds with a fresh arrival seed and the same target. A
check holds when its attainment is at least the asked fraction (90%). Printed per run: the answer,
the search's requests and wall time, each check's attainment and open-loop verdict; then per slot
count how many checks held.

    python benchmarks/rate_capacity_holds.py                  # slots 1 and 3, 2 runs, 5 checks of 120 s
    python benchmarks/rate_capacity_holds.py --slots 1 --runs 1 --time-scale 0.5
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
sys.path.insert(0, str(ROOT / "tests"))

from servers import CAPACITY_SIM, LOADGEN, SimProcess  # noqa: E402

E2E_S = 3.0
ATTAINMENT = 0.9


def _run(args: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([*LOADGEN, *args], capture_output=True, text=True, timeout=3600)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"loadgen {' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def one_run(slots: int, scale: float, checks: int, long_s: float, seed: int, out: Path) -> tuple[float | None, list]:
    """One search, then its checks; `--hold` is the checks' length (the fresh run the answer must hold on)."""
    slo = f"e2e={E2E_S * scale:g}s"
    profile = out / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    with SimProcess("--profile", str(profile), "--slots", str(slots), "--time-scale", repr(scale),
                    "--seed", str(seed)) as sim:
        began = time.monotonic()
        _run(["capacity", "--url", sim.url, "--by", "rate", "--slo", slo, "--max-concurrency", f"{100 / scale:g}",
              "--start", f"{1 / scale:g}", "--hold", f"{long_s * scale:g}s", "--arrival-seed", str(100 * seed), "--n-predict", "64", "--warmup", "1", "--output", str(out / "capacity"),
              "--force"])
        wall = time.monotonic() - began
        cap = json.loads((out / "capacity" / "capacity.json").read_text())["capacity"]
        rate = cap["feasible_max"]
        print(f"  slots {slots}, seed {seed}: capacity {rate and rate * scale:.3g} req/s "
              f"({cap['requests']} requests, {wall:.0f} s wall; {cap['verdict']})", flush=True)
        held = []
        if not rate:
            return None, held
        for k in range(checks):
            run_dir = out / f"check{k}"
            _run(["sweep", "--url", sim.url, "--rate", f"{rate:g}", "--duration", f"{long_s * scale:g}s", "--slo", slo,
                  "--arrival-seed", str(1000 * seed + k + 101), "--n-predict", "64", "--warmup", "1",
                  "--output", str(run_dir), "--force"])
            target = json.loads((run_dir / "run.json").read_text())["targets"][0]
            level = target["levels"][0]
            attained = level["slo"]["attainment"]
            judged = ((target.get("verdict") or {}).get("levels") or [{}])[0].get("open_loop") or {}
            verdict = judged.get("verdict")
            held.append(attained >= ATTAINMENT)
            print(f"    check {k + 1}: attainment {attained:.1%} over {level['requests_ok'] + level['requests_failed']} "
                  f"requests{f', {verdict}' if verdict else ''} -> {'holds' if held[-1] else 'MISSES'}", flush=True)
        return rate * scale, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--checks", type=int, default=5)
    parser.add_argument("--long", type=float, default=120.0, help="simulated seconds per check")
    parser.add_argument("--time-scale", type=float, default=0.25)
    args = parser.parse_args()
    print(f"rate capacity vs {args.checks} checks of {args.long:g} s at the answer (e2e <= {E2E_S:g} s for "
          f"{ATTAINMENT:.0%}), simulator at time scale {args.time_scale:g}")
    for slots in args.slots:
        held_all: list[bool] = []
        for run in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                _, held = one_run(slots, args.time_scale, args.checks, args.long, run + 1, Path(tmp))
            held_all += held
        print(f"slots {slots}: {sum(held_all)} of {len(held_all)} checks held")


if __name__ == "__main__":
    main()
