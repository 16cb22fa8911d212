#!/usr/bin/env python3
"""Runs of any length in constant memory: what a whole `loadgen sweep` costs as its level grows.

Against the private nginx of `engine_overhead.py` (a canned non-stream llama.cpp `/completion`,
one worker on its own core), the `loadgen sweep` command is run as a user runs it, pinned to one
core, at concurrency 64, once for a short level and once for a long one. Printed, never asserted:

- peak RSS of each run (the kernel's maxrss), and RSS per million requests of the long one over the short
- tail: seconds from the level's line on stderr (the level ended) to the command's exit
- bytes per request of requests.jsonl and of the same records exported to requests.parquet
- CPU per request of the whole command (`--requests N`), start-up (a 64-request sweep's CPU)
  subtracted, next to a bare aiohttp+uvloop loop (`engine_overhead.py`'s `bare`) of N requests, and
  their ratio; and, to show where the sweep's CPU goes, the same ratio for the fast transport's own
  bare loop (`transport.py`'s `bare-fast`: the floor of any client on that transport) and for
  `run_level` alone through it (`transport.py`'s `engine+fast`: the engine, no command, no records
  written). These run in `--rounds` rounds, one of each per round; the ratios are medians of each
  round's own (a shared machine moves single figures by ±20% from one minute to the next)
- start-up: `loadgen --help` wall time (median of 5) and `import loadgen.cli`'s import time, and
  whether scipy or matplotlib were imported

    python benchmarks/records_stream.py [--short 60] [--long 600] [--concurrency 64] [--rounds 3] [--requests 300000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_overhead import Nginx, ensure_nginx, pick_cpus, run_child  # noqa: E402
from transport import run_child as run_transport_child  # noqa: E402

LOADGEN = [sys.executable, "-m", "loadgen.cli"]


def _pinned(cpu: int | None):
    return (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None


def sweep(url: str, out: Path, cpu: int | None, concurrency: int, *budget: str) -> dict:
    """One `loadgen sweep`; its requests, CPU seconds, peak RSS (MB) and tail (s)."""
    cmd = [*LOADGEN, "sweep", "--url", url, "--concurrency", str(concurrency), *budget, "--warmup", "0",
           "--no-histograms", "--output", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_pinned(cpu))
    level_end = None
    for line in proc.stderr:  # the level's line is printed when it ends
        if level_end is None and re.search(rf"c={concurrency}: [\d,]+ ok", line):
            level_end = time.monotonic()
    _, status, usage = os.wait4(proc.pid, 0)
    exited = time.monotonic()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    level = json.loads((out / "run.json").read_text())["targets"][0]["levels"][0]
    return {"requests": level["requests_ok"] + level["requests_failed"], "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024, "tail_s": None if level_end is None else exited - level_end}


def cpu_round(url: str, work: Path, cpu: int | None, concurrency: int, requests: int) -> dict[str, float]:
    """One round of the CPU comparison: µs per request of each variant, all on the same core."""
    start = sweep(url, work / "startup", cpu, concurrency, "--requests", str(concurrency))
    whole = sweep(url, work / "sweep", cpu, concurrency, "--requests", str(requests))
    out = {"sweep": (whole["cpu_s"] - start["cpu_s"]) / (whole["requests"] - start["requests"]) * 1e6}
    for name, run in (("bare", run_child), ("bare-fast", run_transport_child), ("engine+fast", run_transport_child)):
        result = run(name, url, requests, concurrency, cpu)
        if result.get("crashed") or result["failed"]:
            raise RuntimeError(f"the {name} loop failed")
        out[name] = result["cpu_s"] / result["done"] * 1e6
    return out


def startup() -> tuple[float, float, bool]:
    walls = []
    for _ in range(5):
        t = time.monotonic()
        subprocess.run([*LOADGEN, "--help"], stdout=subprocess.DEVNULL, check=True)
        walls.append(time.monotonic() - t)
    trace = subprocess.run([sys.executable, "-X", "importtime", "-c", "import loadgen.cli"], capture_output=True,
                           text=True, check=True).stderr
    cumulative_us = [int(line.split("|")[1]) for line in trace.splitlines()
                     if line.startswith("import time:") and line.split("|")[-1].strip() == "loadgen.cli"]
    heavy = bool(re.search(r"\| +(scipy|matplotlib)(\.|$)", trace, re.M))
    return statistics.median(walls), cumulative_us[-1] / 1e6, heavy


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=float, default=60, help="seconds of the short level")
    ap.add_argument("--long", type=float, default=600, help="seconds of the long level")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the CPU comparison")
    ap.add_argument("--requests", type=int, default=300_000, help="requests per variant in a CPU round")
    args = ap.parse_args()

    help_s, import_s, heavy = startup()
    client_cpu, server_cpu = pick_cpus()
    nginx = Nginx(ensure_nginx(), server_cpu)
    nginx.start()
    work = Path(tempfile.mkdtemp(prefix="loadgen-bench-records-"))
    try:
        short = sweep(nginx.url, work / "short", client_cpu, args.concurrency, "--duration", f"{args.short:g}")
        long = sweep(nginx.url, work / "long", client_cpu, args.concurrency, "--duration", f"{args.long:g}")
        export = subprocess.run([*LOADGEN, "export", str(work / "short"), "--format", "parquet"], capture_output=True,
                                text=True)
        rounds = [cpu_round(nginx.url, work / f"round{i}", client_cpu, args.concurrency, args.requests)
                  for i in range(args.rounds)]
    finally:
        nginx.stop()
    jsonl_b = (work / "short" / "requests.jsonl").stat().st_size / short["requests"]
    parquet = work / "short" / "requests.parquet"
    parquet_b = parquet.stat().st_size / short["requests"] if export.returncode == 0 else float("nan")
    growth = (long["rss_mb"] - short["rss_mb"]) / ((long["requests"] - short["requests"]) / 1e6)
    print(f"start-up: loadgen --help {help_s:.3f} s (median of 5); import loadgen.cli {import_s * 1000:.0f} ms; "
          f"scipy/matplotlib imported: {'yes' if heavy else 'no'}")
    print(f"{'level':>6} {'requests':>10} {'peak RSS MB':>12} {'tail s':>7} {'CPU s':>7}")
    for name, r in (("short", short), ("long", long)):
        print(f"{name:>6} {r['requests']:>10,} {r['rss_mb']:>12.1f} {r['tail_s'] or float('nan'):>7.2f} {r['cpu_s']:>7.1f}")
    print(f"peak RSS long - short: {long['rss_mb'] - short['rss_mb']:+.1f} MB ({growth:+.1f} MB per million requests)")
    print(f"records: requests.jsonl {jsonl_b:.0f} B/request, requests.parquet {parquet_b:.0f} B/request")
    print(f"CPU per request, medians of {len(rounds)} rounds of {args.requests:,} requests each "
          f"(ratio: to the bare aiohttp+uvloop loop of the same round):")
    for name, what in (("bare", "bare aiohttp+uvloop loop"), ("bare-fast", "the fast transport's bare loop"),
                       ("engine+fast", "run_level on it"), ("sweep", "the whole loadgen sweep, start-up subtracted")):
        us = statistics.median(r[name] for r in rounds)
        ratios = [r[name] / r["bare"] for r in rounds]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"  {what:<46} {us:6.1f} µs  ratio {statistics.median(ratios):.2f}  (rounds: {each})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
