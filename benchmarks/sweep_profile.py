#!/usr/bin/env python3
"""Where a sweep's CPU per request goes: the whole `loadgen sweep` command under cProfile, each
function's own time attributed to the part of loadgen (or the library) it belongs to.

Against benchmarks/workers.py's private nginx (a canned `/completion`, JSON or 64 SSE events with
`--stream`), one level at concurrency 64 for `--seconds`, the client pinned to one core. cProfile
slows every Python call, so the absolute figures are inflated (the steady figure without it is
benchmarks/cpu_vs_build.py's); the shares are what this prints it for. Printed, never asserted.

    python benchmarks/sweep_profile.py [--seconds 8] [--stream] [--top 12] [--with='--slo e2e=10s']
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_vs_build import PinnedNginx  # noqa: E402
from engine_overhead import ensure_nginx, pick_cpus  # noqa: E402

# (part, a substring of the function's file) in the order they are tried: the first that matches names the part.
PARTS = [
    ("transport (fast: sockets, httptools)", "loadgen/client/fast"),
    ("transport (fast: sockets, httptools)", "loadgen/client/http_parser"),
    ("transport (fast: sockets, httptools)", "loadgen/client/pool"),
    ("transport (fast: sockets, httptools)", "loadgen/client/connections"),
    ("transport (fast: sockets, httptools)", "loadgen/client/transport"),
    ("transport (fast: sockets, httptools)", "httptools"),
    ("response parsing (backends, SSE)", "loadgen/client/backends"),
    ("response parsing (backends, SSE)", "loadgen/client/sse"),
    ("request bodies and salts", "loadgen/run/salts"),
    ("request bodies and salts", "loadgen/client/body"),
    ("engine (workers, schedule)", "loadgen/run/engine"),
    ("engine (workers, schedule)", "loadgen/run/loops"),
    ("records (make, batch, encode, write)", "loadgen/core/records"),
    ("records (make, batch, encode, write)", "loadgen/core/recordsink"),
    ("records (make, batch, encode, write)", "loadgen/results"),
    ("records (make, batch, encode, write)", "loadgen/run/recording"),
    ("level figures (aggregate, histograms)", "loadgen/analysis"),
    ("level figures (aggregate, histograms)", "hdrh"),
    ("level figures (aggregate, histograms)", "numpy"),
    ("progress and observers", "loadgen/output"),
    ("progress and observers", "rich"),
    ("machine and probe sampling", "loadgen/client/probe"),
    ("machine and probe sampling", "loadgen/client/machine_facts"),
    ("machine and probe sampling", "loadgen/run/machine_sampling"),
    ("other loadgen", "loadgen/"),
    ("event loop (uvloop, asyncio)", "uvloop"),
    ("event loop (uvloop, asyncio)", "asyncio"),
]


def part_of(filename: str, name: str) -> str:
    if filename == "~":  # a built-in: named by what it is
        if "msgspec" in name or "encode" in name or "decode" in name:
            return "records (make, batch, encode, write)" if "encode" in name else "response parsing (backends, SSE)"
        if "socket" in name or "sock_" in name or "send" in name or "recv" in name:
            return "transport (fast: sockets, httptools)"
        return "built-ins (other)"
    for part, fragment in PARTS:
        if fragment in filename:
            return part
    return "Python's library (other)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--top", type=int, default=12, help="Also print the N functions with the most own time.")
    ap.add_argument("--with", dest="extra", default="", help="More sweep options, e.g. --with='--slo e2e=10s'.")
    args = ap.parse_args()
    client_cpu, server_cpu = pick_cpus()
    server = PinnedNginx(ensure_nginx(), args.stream, server_cpu)
    server.start()
    try:
        with tempfile.TemporaryDirectory(prefix="loadgen-profile-") as tmp:
            out, prof = Path(tmp) / "run", Path(tmp) / "sweep.prof"
            cmd = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "loadgen", "sweep", "--url", server.url,
                   "--concurrency", "64", "--duration", f"{args.seconds:g}", "--warmup", "2", "--no-histograms",
                   "--output", str(out), *(["--stream"] if args.stream else []), *args.extra.split()]
            pin = (lambda: os.sched_setaffinity(0, {client_cpu})) if client_cpu is not None else None
            done = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pin)
            if done.returncode != 0:
                raise RuntimeError(done.stderr[-2000:])
            [level] = json.loads((out / "run.json").read_text())["targets"][0]["levels"]
            requests = level["requests_ok"] + level["requests_failed"]
            stats = pstats.Stats(str(prof))
    finally:
        server.stop()
    own: dict[str, float] = defaultdict(float)
    rows = []
    for (filename, _, name), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        own[part_of(filename, name)] += tottime
        rows.append((tottime, f"{Path(filename).name}:{name}" if filename != "~" else name))
    total = sum(own.values())
    print(f"{'stream' if args.stream else 'non-stream'}: {requests:,} requests in the level, "
          f"{total / requests * 1e6:.1f} µs of profiled CPU per request (the whole command)")
    for part, seconds in sorted(own.items(), key=lambda kv: -kv[1]):
        print(f"  {part:42s} {seconds / requests * 1e6:6.2f} µs/request  {seconds / total:6.1%}")
    print(f"  top {args.top} functions by own time:")
    for seconds, name in sorted(rows, reverse=True)[:args.top]:
        print(f"    {name:60s} {seconds / requests * 1e6:6.2f} µs/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
