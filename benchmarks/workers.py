#!/usr/bin/env python3
"""`--workers 2` against `--workers 1`: the whole `loadgen sweep` command, end to end.

The target is a private nginx (benchmarks/engine_overhead.py's pattern: its own prefix and config in
a temp dir, one worker process, a free loopback port, stopped by pid) answering `POST /completion`
instantly with a canned llama-server response, or with 64 canned SSE events (`--stream`). Nothing
is pinned: on this 2-core machine the server takes its share of the same cores, as a local server
does.

Per variant and part, two sweeps of one level at concurrency 64 (part `rate`: open loop at
`--rate` requests/s, the same load for both, so CPU per request is what the same work costs with
and without workers, not how each fares on a saturated machine), of `--short` and `--long`
seconds. Client CPU (the sweep process and its workers, from the kernel's accounting of waited-for
children) and requests are differenced between the two, so start-up, probing and warm-up cancel
out: CPU per request is what one more second of load costs, records, merging and the final write
included. The parent's own part of it (what merging the workers costs) is printed apart: the
sweep process reads its own CPU at exit. Requests/s (and events/s when streaming) are the long level's `requests_ok / wall_s`.
The server's CPU (nginx's worker, from /proc) over the long level gives its share of the machine.
It also checks, on the long `--workers 2` run, that the merged latency histogram
(histograms/workers.hlog) equals the one built from every record, bucket for bucket.

Figures are printed, never asserted; the exit status is 1 only when a sweep failed.

    python benchmarks/workers.py [--short 3] [--long 12] [--rounds 5] [--parts nonstream,stream,rate] [--rate 15000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_overhead import Nginx, ensure_nginx  # noqa: E402
from transport import SSE_BODY, SSE_EVENTS  # noqa: E402

# The sweep, telling at exit its own CPU apart from its workers' (the parent's share: merging).
SELF_CPU = """
import atexit, os, resource, sys
def told():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["LOADGEN_BENCH_SELF_CPU"], "w") as f:
        f.write(str(ru.ru_utime + ru.ru_stime))
atexit.register(told)
sys.argv[0] = "loadgen"
from loadgen.cli.main import main
main()
"""
LOADGEN = [sys.executable, "-c", SELF_CPU]
HEALTH = '        location = /health { default_type application/json; return 200 \'{"status":"ok"}\'; }\n'


class BenchNginx(Nginx):
    """The canned /completion (JSON, or with `stream` the SSE events), and a /health that says ok."""

    def __init__(self, binary: str, stream: bool):
        super().__init__(binary, cpu=None)
        self.stream = stream

    def config(self) -> str:
        conf = super().config()
        if self.stream:
            (self.dir / "completion").write_text(SSE_BODY)
            start = conf.index("        location = /completion {")
            end = conf.index("\n        }\n", start) + len("\n        }")
            conf = conf[:start] + f"""        location = /completion {{
            root {self.dir};
            default_type text/event-stream;
            error_page 405 =200 $uri;
        }}""" + conf[end:]
        return conf.replace("        location = /completion {", HEALTH + "        location = /completion {", 1)

    def start(self) -> None:
        if not self.stream:
            return super().start()
        conf = self.dir / "nginx.conf"
        conf.write_text(self.config())
        cmd = [self.binary, "-p", str(self.dir), "-c", str(conf), "-e", str(self.dir / "error.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        import urllib.request
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not answer on time")

    def cpu_s(self) -> float:
        """CPU seconds of the master and its workers so far."""
        assert self.proc is not None
        pids = [self.proc.pid, *map(int, Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split())]
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        return total


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def sweep(url: str, workers: int | str, seconds: float, stream: bool, out: Path, server: BenchNginx,
          rate: float | None = None) -> dict:
    processes = ["--workers", "2", "--ray"] if workers == "ray" else ["--workers", str(workers)]
    load = ["--concurrency", "64"] if rate is None else ["--rate", f"{rate:g}", "--max-in-flight", "64",
                                                         "--arrival", "constant"]
    cmd = [*LOADGEN, "sweep", "--url", url, *load, "--duration", str(seconds), "--warmup", "2",
           *processes, "--output", str(out), "--force", "--no-histograms",
           *(["--stream"] if stream else [])]
    cpu0, server0 = children_cpu_s(), server.cpu_s()
    told = out.parent / f"{out.name}.self-cpu"
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LOADGEN_BENCH_SELF_CPU": str(told)})
    cpu, server_cpu = children_cpu_s() - cpu0, server.cpu_s() - server0
    if done.returncode != 0:
        raise RuntimeError(f"sweep --workers {workers} exited {done.returncode}: {done.stderr[-2000:]}")
    [level] = json.loads((out / "run.json").read_text())["targets"][0]["levels"]
    return {"cpu_s": cpu, "parent_cpu_s": float(told.read_text()) if told.exists() else 0.0,
            "requests": level["requests_ok"] + level["requests_failed"], "ok": level["requests_ok"],
            "wall_s": level["wall_s"], "server_cpu_s": server_cpu}


def merged_histogram_is_exact(run_dir: Path) -> bool:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from hdrh.log import HistogramLogReader

    from loadgen.core.records import RequestRecord
    from loadgen.output.exporters import metric_histogram

    records = [RequestRecord.from_dict(json.loads(line)) for line in (run_dir / "requests.jsonl").open()]
    reader = HistogramLogReader(str(run_dir / "histograms" / "workers.hlog"), metric_histogram([], "latency"))
    while (h := reader.get_next_interval_histogram()) is not None:
        if h.get_tag().endswith("/latency"):
            whole = metric_histogram(records, "latency")  # every bucket of the merged one must match
            return h.get_total_count() == whole.get_total_count() and list(h.counts) == list(whole.counts)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=float, default=3.0)
    ap.add_argument("--long", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parts", default="nonstream,stream,rate",
                    help="nonstream, stream (closed loop at c=64: as fast as each client goes), rate (open "
                         "loop, non-stream, at --rate requests/s for both: the cost of the same load)")
    ap.add_argument("--rate", type=float, default=15000.0)
    ap.add_argument("--ray", action="store_true", help="also 2 Ray actors on a local cluster (requests/s only: "
                                                       "the actors' CPU is not the sweep's children's)")
    args = ap.parse_args()
    binary = ensure_nginx()
    tmp = Path(tempfile.mkdtemp(prefix="loadgen-bench-workers-"))
    for part in args.parts.split(","):
        stream = part == "stream"
        rate = args.rate if part == "rate" else None
        server = BenchNginx(binary, stream)
        server.start()
        try:
            variants: list[int | str] = [1, 2, *(["ray"] if args.ray else [])]
            rows: dict[int | str, list[dict]] = {v: [] for v in variants}
            exact = None
            for r in range(args.rounds):
                for workers in (variants if r % 2 == 0 else variants[::-1]):
                    short = sweep(server.url, workers, args.short, stream, tmp / f"s{workers}", server, rate)
                    long = sweep(server.url, workers, args.long, stream, tmp / f"l{workers}", server, rate)
                    if workers == 2:
                        # --no-histograms skips the .hgrm files only; workers.hlog is written
                        exact = merged_histogram_is_exact(tmp / f"l{workers}")
                    more = long["requests"] - short["requests"]
                    rows[workers].append({
                        "cpu_us_per_req": (long["cpu_s"] - short["cpu_s"]) / more * 1e6,
                        "parent_us_per_req": (long["parent_cpu_s"] - short["parent_cpu_s"]) / more * 1e6,
                        "req_s": long["ok"] / long["wall_s"],
                        "server_share": long["server_cpu_s"] / long["wall_s"]})
        finally:
            server.stop()
        per_event = SSE_EVENTS if stream else 1
        how = "concurrency 64" if rate is None else f"open loop at {rate:,.0f} requests/s (at most 64 in flight)"
        print(f"\n{part}: {how}, levels of {args.short:g} and {args.long:g} s, {args.rounds} rounds (medians)")
        print("| --workers | client CPU µs/request | of which the parent's | requests/s | events/s | server CPU (cores) |")
        print("| --- | --- | --- | --- | --- | --- |")
        med = {w: {k: statistics.median(x[k] for x in rows[w]) for k in rows[w][0]} for w in rows}
        for w in variants:
            m = med[w]
            cpu = "n/a" if w == "ray" else f"{m['cpu_us_per_req']:.1f}"
            parent = "n/a" if w in ("ray", 1) else f"{m['parent_us_per_req']:.1f}"
            name = "2 --ray (local cluster)" if w == "ray" else w
            print(f"| {name} | {cpu} | {parent} | {m['req_s']:,.0f} | {m['req_s'] * per_event:,.0f} | "
                  f"{m['server_share']:.2f} |")
        for w in variants:  # every round, to see the spread the medians hide
            print(f"rounds, --workers {w}: " + "; ".join(
                f"{x['cpu_us_per_req']:.1f} µs, {x['req_s']:,.0f}/s" for x in rows[w]))
        # Each round runs both variants minutes apart at most: the ratio within a round is the figure
        # least moved by a shared machine's load, which changes between rounds.
        cpu_ratio = statistics.median(b["cpu_us_per_req"] / a["cpu_us_per_req"] for a, b in zip(rows[1], rows[2]))
        rate_ratio = statistics.median(b["req_s"] / a["req_s"] for a, b in zip(rows[1], rows[2]))
        print(f"2 vs 1, median of the rounds' ratios: CPU per request {cpu_ratio:.2f}x, requests/s {rate_ratio:.2f}x "
              f"(ratio of the medians: {med[2]['cpu_us_per_req'] / med[1]['cpu_us_per_req']:.2f}x, "
              f"{med[2]['req_s'] / med[1]['req_s']:.2f}x); "
              f"merged latency histogram equals the all-records one: {exact}")
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
