#!/usr/bin/env python3
"""How much client CPU does loadgen's engine spend per request, next to a bare aiohttp loop?

Both sides run against an *instant* server that is not Python-bound: a private nginx instance
(its own prefix and config in a temp dir, one worker, on a free loopback port) that answers
`POST /completion` with a canned llama-server response. The client is then the bottleneck, so
client CPU per request is what is measured.

Variants, each in a fresh child process pinned to one core with uvloop as the loop:

  bare        the yardstick: C tasks doing `async with session.post(url, data=body) as r:
              await r.read()` back to back on one aiohttp ClientSession.
  engine      loadgen's `run_level` through `AiohttpTransport` and the llama.cpp backend:
              salts, bodies built per request, responses parsed, one RequestRecord each.
  engine+obs  the same plus the live `ProgressObserver` (Rich, to /dev/null) and
              `summarize_level` (HdrHistogram percentiles) at the end: the full bookkeeping.
  engine+prom engine+obs with `--prometheus-port` as a run has it: the observer wrapped by
              `LiveMetrics`, its endpoint served, and a thread of the same process scraping it
              every second (so the scrapes' CPU counts too).

`--transport fast` runs the engine variants through the default fast transport instead of aiohttp.

Rounds alternate the variants (rotated order each round) and the median is reported, which
beats most of the noise of a shared machine. Timings are printed, never asserted; the exit
status is non-zero only when a request failed (or the server could not be started).

    python benchmarks/engine_overhead.py [--requests 20000] [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

VARIANTS = ("bare", "engine", "engine+obs", "engine+prom")

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."

# ~96 tokens of text; no ' $ \ characters, so it can sit verbatim in nginx's `return 200 '...'`.
CONTENT = (
    " The lighthouse stood at the edge of the world, or so it seemed to Elias, who had kept its"
    " lamp burning for thirty-one winters. Each evening he climbed the spiral stairs, counted the"
    " steps out of habit, and wiped the salt from the great lens. One grey morning, walking the"
    " shingle after a storm, he found a green bottle wedged between two rocks. Inside was a letter,"
    " folded small, written in a careful hand he did not recognise, addressed simply to the keeper."
)
CANNED = {
    "index": 0, "content": CONTENT, "tokens": [], "id_slot": 0, "stop": True, "model": "bench",
    "tokens_predicted": 96, "tokens_evaluated": 20, "stop_type": "limit", "stopping_word": "",
    "tokens_cached": 115,
    "timings": {"cache_n": 0, "prompt_n": 20, "prompt_ms": 5.1, "prompt_per_second": 3921.5,
                "predicted_n": 96, "predicted_ms": 500.0, "predicted_per_token_ms": 5.2,
                "predicted_per_second": 190.0},
}
CANNED_BODY = json.dumps(CANNED, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# nginx
# --------------------------------------------------------------------------------------------

def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None)


def ensure_nginx() -> str:
    path = find_nginx()
    if path:
        return path
    print("nginx not found: installing it with apt-get (nginx-light, else nginx) ...", flush=True)
    apt = ["apt-get"] if os.geteuid() == 0 else ["sudo", "-n", "apt-get"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(apt + ["update", "-qq"], check=True, env=env)
    for pkg in ("nginx-light", "nginx"):
        if subprocess.run(apt + ["install", "-y", "-qq", pkg], env=env).returncode == 0:
            break
    path = find_nginx()
    if not path:
        sys.exit("could not install nginx (apt-get install nginx-light / nginx failed)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """A private nginx: own prefix/config/pid/logs in a temp dir, one worker, stopped by pid."""

    def __init__(self, binary: str, cpu: int | None):
        self.binary = binary
        self.cpu = cpu
        self.dir = Path(tempfile.mkdtemp(prefix="loadgen-bench-nginx-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def config(self) -> str:
        for ch in "'$\\":
            assert ch not in CANNED_BODY, f"canned body must not contain {ch!r}"
        d = self.dir
        affinity = f"worker_cpu_affinity {1 << self.cpu:b};" if self.cpu is not None else ""
        user = "user root;" if os.geteuid() == 0 else ""
        return f"""
daemon off;
master_process on;
{user}
worker_processes 1;
{affinity}
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    tcp_nodelay on;
    server {{
        listen 127.0.0.1:{self.port} backlog=4096;
        location = /completion {{
            default_type application/json;
            return 200 '{CANNED_BODY}';
        }}
    }}
}}
"""

    def start(self) -> None:
        conf = self.dir / "nginx.conf"
        conf.write_text(self.config())
        # `daemon off`: the Popen pid is the master's, so it is stopped by its own pid.
        cmd = [self.binary, "-p", str(self.dir), "-c", str(conf), "-e", str(self.dir / "error.log")]
        if self.cpu is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", str(self.cpu)] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                log = (self.dir / "error.log").read_text(errors="replace") if (self.dir / "error.log").exists() else ""
                raise RuntimeError(f"nginx exited with {self.proc.returncode}: {err}{log}")
            try:
                req = urllib.request.Request(self.url + "/completion", data=b"{}", method="POST")
                with urllib.request.urlopen(req, timeout=1) as r:
                    body = r.read()
                if r.status == 200 and json.loads(body) == CANNED:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not answer on time")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown of the master and its worker
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# child: one variant, one process
# --------------------------------------------------------------------------------------------

def _cpu_s() -> float:
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


async def _bare(url: str, body: bytes, requests: int, concurrency: int) -> dict:
    import aiohttp

    async def loop(session, n: int, bad: list[int]) -> None:
        remaining = [n]

        async def task() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                async with session.post(url, data=body) as r:
                    data = await r.read()
                    if r.status != 200 or len(data) != len(CANNED_BODY):
                        bad[0] += 1

        await asyncio.gather(*(task() for _ in range(concurrency)))

    url = url + "/completion"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await loop(session, concurrency * 4, [0])  # warm-up: open the pool's connections
        bad = [0]
        cpu0, t0 = _cpu_s(), time.perf_counter()
        await loop(session, requests, bad)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    return {"done": requests, "failed": bad[0], "wall_s": wall, "cpu_s": cpu}


async def _engine(url: str, requests: int, concurrency: int, with_obs: bool, with_prom: bool = False,
                  transport_name: str = "aiohttp") -> dict:
    from rich.console import Console

    from loadgen.analysis.aggregate import summarize_level
    from loadgen.client.aiohttp_transport import AiohttpTransport
    from loadgen.client.backends import GenerationParams, make_backend
    from loadgen.core.records import LevelRun
    from loadgen.output.progress import ProgressObserver
    from loadgen.run.engine import run_level

    backend = make_backend("llamacpp", GenerationParams(prompt=PROMPT))
    if transport_name == "fast":
        from loadgen.client.registry import make_transport
        transport = make_transport("fast", url)
    else:
        transport = AiohttpTransport()
    await transport.open(url, concurrency, 60.0)
    devnull = open(os.devnull, "w")  # noqa: SIM115 (closed in the finally below, after the levels)
    try:
        warm = await run_level(LevelRun("bench", concurrency), transport, backend,
                               requests=concurrency * 4, duration_s=None)
        assert all(r.ok for r in warm.records), "warm-up failed"
        level = LevelRun("bench", concurrency)
        summary_s = None
        cpu0, t0 = _cpu_s(), time.perf_counter()
        if with_obs:
            # force_terminal: measure the live progress bar, as a user at a terminal has it
            with ProgressObserver(Console(file=devnull, force_terminal=True)) as obs, _live(with_prom) as live:
                await run_level(level, transport, backend, requests=requests, duration_s=None,
                                observer=live.observe(obs) if live else obs)
            s0 = time.perf_counter()
            summary = summarize_level(concurrency, level.records, level.stopped_reason)
            summary_s = time.perf_counter() - s0
            assert summary.requests_ok + summary.requests_failed == len(level.records)
        else:
            await run_level(level, transport, backend, requests=requests, duration_s=None)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        await transport.close()
        devnull.close()
    failed = [r for r in level.records if r.error_kind is not None]
    if failed:
        print(f"first failure: {failed[0].error_kind}: {failed[0].error_message}", file=sys.stderr)
    missing = max(0, requests - len(level.records))  # a level that stopped early fails the run too
    return {"done": len(level.records), "failed": len(failed) + missing, "wall_s": wall, "cpu_s": cpu,
            "summary_s": summary_s, "stopped_reason": level.stopped_reason}


@contextlib.contextmanager
def _live(enabled: bool):
    """--prometheus-port's live metrics, served, and scraped every second by a thread of this process."""
    if not enabled:
        yield None
        return
    from loadgen.run.live.endpoint import LiveEndpoint
    from loadgen.run.live.metrics import LiveMetrics

    live = LiveMetrics()
    stop = threading.Event()
    with LiveEndpoint(live, free_port()) as endpoint:
        def scrape() -> None:
            while not stop.wait(1.0):
                urllib.request.urlopen(endpoint.url, timeout=10).read()

        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            yield live
        finally:
            stop.set()
            scraper.join(10)


def child_main(variant: str, url: str, requests: int, concurrency: int, cpu: int | None,
               transport: str = "aiohttp") -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import uvloop

    if variant == "bare":
        coro = _bare(url, _engine_like_body(), requests, concurrency)
    else:
        coro = _engine(url, requests, concurrency, with_obs=variant in ("engine+obs", "engine+prom"),
                       with_prom=variant == "engine+prom", transport_name=transport)
    result = uvloop.run(coro)
    print("RESULT " + json.dumps(result), flush=True)


def _engine_like_body() -> bytes:
    """A body the size of the engine's (same prompt, a uuid4-sized salt), built once."""
    from loadgen.client.backends import GenerationParams, make_backend
    return make_backend("llamacpp", GenerationParams(prompt=PROMPT)).build("0" * 36)


def run_child(variant: str, url: str, requests: int, concurrency: int, cpu: int | None,
              script: str = __file__, transport: str = "aiohttp") -> dict:
    """Run one variant in a fresh `script --_child` process; its last RESULT line as a dict."""
    cmd = [sys.executable, os.path.abspath(script), "--_child", variant, "--_url", url,
           "--requests", str(requests), "--concurrency", str(concurrency)]
    if transport != "aiohttp":  # only this script's children take it (transport.py's choose by variant)
        cmd += ["--transport", transport]
    if cpu is not None:
        cmd += ["--_cpu", str(cpu)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr)
        return {"done": 0, "failed": requests, "wall_s": float("nan"), "cpu_s": float("nan"),
                "crashed": True}
    if proc.stderr.strip():
        sys.stderr.write(proc.stderr)
    return json.loads(lines[-1][len("RESULT "):])


# --------------------------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------------------------

def pick_cpus() -> tuple[int | None, int | None]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= 2:
        return cpus[0], cpus[1]
    return None, None  # one core: no pinning, client and server share it


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="requests per variant per round")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--transport", choices=("aiohttp", "fast"), default="aiohttp",
                    help="the engine variants' transport (the bare loop is always aiohttp)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_cpu", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._child:
        child_main(args._child, args._url, args.requests, args.concurrency, args._cpu, args.transport)
        return 0

    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants: {', '.join(sorted(unknown))}")

    client_cpu, server_cpu = pick_cpus()
    nginx = Nginx(ensure_nginx(), server_cpu)
    nginx.start()
    import aiohttp
    import uvloop
    print(f"nginx {nginx.url}  (1 worker, cpu {server_cpu})  client cpu {client_cpu}  "
          f"python {sys.version.split()[0]}  aiohttp {aiohttp.__version__}  uvloop {uvloop.__version__}")
    print(f"{args.requests:,} requests x {len(variants)} variants x {args.rounds} rounds, "
          f"concurrency {args.concurrency}, canned body {len(CANNED_BODY)} B\n", flush=True)

    results: dict[str, list[dict]] = {v: [] for v in variants}
    try:
        for rnd in range(args.rounds):
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
            for v in order:
                r = run_child(v, nginx.url, args.requests, args.concurrency, client_cpu, transport=args.transport)
                results[v].append(r)
                print(f"  round {rnd + 1} {v:<11} {r['done']:>7,} req  {r['failed']} failed  "
                      f"{r['done'] / r['wall_s']:>8,.0f} req/s  "
                      f"{r['cpu_s'] / max(r['done'], 1) * 1e6:>6.1f} CPU µs/req", flush=True)
    finally:
        nginx.stop()

    def med(v: str, f) -> float:
        return statistics.median(f(r) for r in results[v])

    cpu_us = {v: med(v, lambda r: r["cpu_s"] / max(r["done"], 1) * 1e6) for v in variants}
    rps = {v: med(v, lambda r: r["done"] / r["wall_s"]) for v in variants}
    total = {v: sum(r["done"] for r in results[v]) for v in variants}
    failed = {v: sum(r["failed"] for r in results[v]) for v in variants}

    print(f"\nmedian of {args.rounds} round(s), concurrency {args.concurrency}, client pinned to one core:")
    print(f"{'variant':<12}{'requests':>10}{'failed':>8}{'req/s':>10}{'CPU µs/req':>12}{'vs bare':>10}")
    for v in variants:
        rel = f"{(cpu_us[v] / cpu_us['bare'] - 1) * 100:+.1f}%" if "bare" in variants and v != "bare" else ""
        print(f"{v:<12}{total[v]:>10,}{failed[v]:>8}{rps[v]:>10,.0f}{cpu_us[v]:>12.1f}{rel:>10}")
    if "engine+obs" in variants:
        sums = [r["summary_s"] for r in results["engine+obs"] if r.get("summary_s") is not None]
        if sums:
            s = statistics.median(sums)
            print(f"  (summarize_level of {args.requests:,} records: {s * 1e3:.0f} ms = "
                  f"{s / args.requests * 1e6:.1f} µs/req, included in engine+obs)")
    if "bare" in variants:
        for v in variants:
            if v == "bare":
                continue
            # Paired: each round's variant against the same round's bare run, which saw the same load.
            paired = [(r["cpu_s"] / max(r["done"], 1)) / (b["cpu_s"] / max(b["done"], 1))
                      for r, b in zip(results[v], results["bare"])]
            print(f"bookkeeping overhead {v}: {(cpu_us[v] / cpu_us['bare'] - 1) * 100:+.1f}% CPU per "
                  f"request over the bare aiohttp loop (median of paired rounds: "
                  f"{(statistics.median(paired) - 1) * 100:+.1f}%; target: <= +20%)")
    if "engine+prom" in variants and "engine+obs" in variants:
        paired = [(p["cpu_s"] / max(p["done"], 1)) / (o["cpu_s"] / max(o["done"], 1))
                  for p, o in zip(results["engine+prom"], results["engine+obs"])]
        print(f"--prometheus-port overhead: {(cpu_us['engine+prom'] / cpu_us['engine+obs'] - 1) * 100:+.1f}% CPU "
              f"per request over engine+obs (median of paired rounds: {(statistics.median(paired) - 1) * 100:+.1f}%; "
              f"target: <= +10%)")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) + 0.5:  # the benchmark itself keeps about two cores busy
        print(f"note: load average {load:.1f} on {os.cpu_count()} CPUs: other processes shared the "
              f"cores, so expect +-15% noise between rounds")

    if any(failed.values()) or any(r.get("crashed") for rs in results.values() for r in rs):
        print("\nFAILED: some requests did not succeed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
