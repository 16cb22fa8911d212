"""The regression gate on the real test-bed llama-server: false alarms and power, measured.

    python benchmarks/gate_noise.py                    # ~20 minutes on 2 cores
    python benchmarks/gate_noise.py --aa-pairs 10 --power-gates 4   # a quicker look

One llama-server (SmolLM2-135M from scripts/testbed, 4 slots, -t 1) on a free loopback port, stopped
by pid at the end. Every run is a fresh `loadgen sweep` process of the same configuration
(c=4, 16 requests, 16 tokens each, as in the issue that asked for this), so runs differ only by
what the machine does:

1. calibration: --calibrate runs in a row, `loadgen calibrate`'s noise floor (noise_floors).
2. false alarms: 2 x --aa-pairs runs of the unchanged server in a row. Each consecutive pair is an
   A/A gate of one run a side judged against the floor; each window of three pairs (A B A B A B,
   sliding by one pair; pairs counterbalanced A B, B A, as `loadgen ab` runs them) an A/A gate of 3+3 interleaved runs, without and with the floor. Counted:
   gates that exit 1 (a false alarm), and inconclusive ones.
3. power: --power-gates gates of 3+3 interleaved runs where every candidate run shares the
   machine with --burners CPU-burning processes (started before it, stopped by pid after it): the same
   server, slowed by a real cause. Counted: gates that exit 1 (caught), with the throughput change.

The gate is loadgen's own (`analysis.gate.run_gate`) at its default limits and confidence. Prints
the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from loadgen.analysis.compare import RunData, noise_floors  # noqa: E402
from loadgen.analysis.gate import FAIL, INCONCLUSIVE, GateConfig, run_gate  # noqa: E402
from loadgen.results.reader import load_records, load_run  # noqa: E402
from servers import LOADGEN, start_llama_server  # noqa: E402

SWEEP = ["--concurrency", "4", "--requests", "16", "--n-predict", "16", "--warmup", "1", "--no-histograms"]


def one_run(url: str, out: Path) -> RunData:
    proc = subprocess.run([*LOADGEN, "sweep", "--url", url, "--label", "srv", *SWEEP, "--output", str(out)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"gate_noise: a sweep failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return RunData(load_run(out), load_records(out))


@contextmanager
def burners(n: int):
    """`n` processes that spin on the CPU, stopped by pid."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(10)


def throughput(run: RunData) -> float:
    return run.doc["targets"][0]["levels"][0]["throughput_tok_s"]


def gate(base: list[RunData], cand: list[RunData], floors=None):
    result = run_gate(base, cand, GateConfig(), floors=floors)
    status = "fail" if result.with_status(FAIL) else "inconclusive" if result.with_status(INCONCLUSIVE) else "pass"
    change = next(c.comparison.change for c in result.checks if c.metric == "throughput")
    return status, change, result.detectable().get("throughput")


def tally(name: str, outcomes: list[tuple[str, float, float | None]]) -> dict:
    fails = sum(1 for s, _, _ in outcomes if s == "fail")
    unsure = sum(1 for s, _, _ in outcomes if s == "inconclusive")
    detect = [d for _, _, d in outcomes if d is not None]
    changes = [c for _, c, _ in outcomes if c is not None]
    print(f"{name}: {len(outcomes)} gates, exit 1 in {fails}, inconclusive {unsure}; throughput change "
          f"median {statistics.median(changes):+.1%} (range {min(changes):+.1%} .. {max(changes):+.1%})"
          + (f"; detectable throughput change median {statistics.median(detect):.1%}" if detect else ""))
    return {"gates": len(outcomes), "exit_1": fails, "inconclusive": unsure,
            "change_median": statistics.median(changes), "detectable_median": statistics.median(detect) if detect else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibrate", type=int, default=11, help="calibration runs")
    ap.add_argument("--aa-pairs", type=int, default=20, help="A/A pairs of runs")
    ap.add_argument("--power-gates", type=int, default=10, help="3+3 gates with a slowed candidate")
    ap.add_argument("--burners", type=int, default=2, help="CPU-burning processes beside each candidate run")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gate-noise-"))
    server = start_llama_server("gate-noise", 4, work)
    figures: dict = {"config": " ".join(SWEEP), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        t0 = time.monotonic()
        calib = [one_run(server.url, work / f"cal-{i:02d}") for i in range(args.calibrate)]
        floors = noise_floors(calib)
        floor = floors.by_metric["throughput"]
        print(f"calibration: {args.calibrate} runs, throughput noise {floor.sigma:.1%} (df {floor.df}); "
              f"median {statistics.median(map(throughput, calib)):.1f} tok/s", flush=True)
        figures["floor_throughput_sigma"] = floor.sigma
        runs = [one_run(server.url, work / f"aa-{i:03d}") for i in range(2 * args.aa_pairs)]
        tp = [throughput(r) for r in runs]
        print(f"A/A runs: {len(runs)}, throughput {min(tp):.1f} .. {max(tp):.1f} tok/s "
              f"(max/min {max(tp) / min(tp):.2f})", flush=True)
        # counterbalanced like `loadgen ab`: A B, B A, A B, ...
        pairs = [(runs[2 * i], runs[2 * i + 1]) if i % 2 == 0 else (runs[2 * i + 1], runs[2 * i])
                 for i in range(args.aa_pairs)]
        figures["aa_single_floor"] = tally("A/A 1+1 with the floor",
                                           [gate([a], [b], floors) for a, b in pairs])
        windows = [pairs[i:i + 3] for i in range(len(pairs) - 2)]
        figures["aa_3x3"] = tally("A/A 3+3 interleaved", [gate([a for a, _ in w], [b for _, b in w]) for w in windows])
        figures["aa_3x3_floor"] = tally("A/A 3+3 interleaved with the floor",
                                        [gate([a for a, _ in w], [b for _, b in w], floors) for w in windows])
        outcomes, outcomes_floor = [], []
        for g in range(args.power_gates):
            base, cand = [], []
            for i in range(3):
                for side in (("a", "b") if i % 2 == 0 else ("b", "a")):  # counterbalanced, as `ab`
                    if side == "a":
                        base.append(one_run(server.url, work / f"pw-{g:02d}-{i}-a"))
                    else:
                        with burners(args.burners):
                            cand.append(one_run(server.url, work / f"pw-{g:02d}-{i}-b"))
            outcomes.append(gate(base, cand))
            outcomes_floor.append(gate(base, cand, floors))
            print(f"  power gate {g + 1}: {outcomes[-1][0]} ({outcomes[-1][1]:+.1%}), with the floor "
                  f"{outcomes_floor[-1][0]}", flush=True)
        figures["power_3x3"] = tally(f"power 3+3 interleaved, {args.burners} CPU burner(s) beside the candidate",
                                     outcomes)
        figures["power_3x3_floor"] = tally("power 3+3 interleaved with the floor", outcomes_floor)
        figures["minutes"] = (time.monotonic() - t0) / 60
        print(f"took {figures['minutes']:.1f} min")
    finally:
        server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
