#!/usr/bin/env python3
"""Client CPU per request of the fast and aiohttp transports, SSE events/s, and latency accuracy.

Three parts, each variant in a fresh child process pinned to one core with uvloop (the server on
the other core):

  non-stream  against a private nginx answering `POST /completion` with a canned llama-server
              response (see engine_overhead.py): CPU µs/request for
                bare          a bare aiohttp loop (the yardstick of engine_overhead.py)
                bare-fast     the same loop on FastTransport.request (the transport alone)
                engine        loadgen's run_level + llama.cpp backend through AiohttpTransport
                engine+fast   the same through FastTransport
  stream      nginx answering `POST /stream` with 64 SSE events (text/event-stream, 6.5 kB):
              events/s split out of on_chunk's bytes by a minimal line splitter, per transport
              (sse-aiohttp, sse-fast): the transport's share of streaming. stream-engine and
              stream-engine+fast run the same body through run_level with the streaming llama.cpp
              backend (sse.py splitting, every event decoded, chunk times kept in the record).
  accuracy    a Python server (its own core) that answers every request exactly 50 ms after it
              arrived; run_level through the fast transport at concurrency 256, reads timed by the
              kernel (the default) and by the event loop, one after the other: latency - 50 ms,
              next to the client's loop lag and the server's own lateness.

Timings are printed, never asserted; the exit status is 1 only when a request failed.

    python benchmarks/transport.py [--requests 20000] [--rounds 3] [--parts nonstream,stream,accuracy]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import heapq
import json
import os
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_overhead  # noqa: E402
from engine_overhead import (  # noqa: E402
    CANNED_BODY,
    PROMPT,
    Nginx,
    _bare,
    _cpu_s,
    _engine_like_body,
    ensure_nginx,
    free_port,
    pick_cpus,
)

SSE_EVENTS = 64
SSE_BODY = "".join(
    f'data: {{"index":0,"content":" tok{i}","tokens":[{i}],"stop":false,"id_slot":0,'
    f'"tokens_predicted":{i + 1},"tokens_evaluated":20}}\n\n' for i in range(SSE_EVENTS - 1)
) + ('data: {"index":0,"content":"","tokens":[],"stop":true,"id_slot":0,"tokens_predicted":64,'
     '"tokens_evaluated":20,"stop_type":"limit","timings":{"prompt_n":20,"prompt_ms":5.1,'
     '"predicted_n":64,"predicted_ms":300.0,"predicted_per_second":213.3}}\n\n')

NONSTREAM = ("bare", "bare-fast", "engine", "engine+fast")
STREAM = ("sse-aiohttp", "sse-fast", "stream-engine", "stream-engine+fast")
HOLD_S = 0.050


class StreamingNginx(Nginx):
    """The benchmark nginx plus `POST /stream`: 64 canned SSE events.

    The body is longer than a `return` string may be, so it is a static file; nginx refuses POST
    on those (405), and `error_page 405 =200 $uri` serves the file in answer instead.
    """

    def config(self) -> str:
        (self.dir / "stream").write_text(SSE_BODY)
        stream = f"""        location = /stream {{
            root {self.dir};
            default_type text/event-stream;
            error_page 405 =200 $uri;
        }}
"""
        conf = super().config()
        return conf.replace("        location = /completion {", stream + "        location = /completion {", 1)


# --------------------------------------------------------------------------------------------
# children
# --------------------------------------------------------------------------------------------

async def _engine(url: str, requests: int, concurrency: int, transport_name: str, stream: bool = False,
                  keep_latencies: bool = False, kernel_stamps: bool = True) -> dict:
    from loadgen.client.backends import GenerationParams, make_backend
    from loadgen.client.fast import FastTransport
    from loadgen.client.registry import make_transport
    from loadgen.core.records import LevelRun
    from loadgen.run.engine import run_level
    from loadgen.run.looplag import LoopLagSampler

    backend = make_backend("llamacpp", GenerationParams(prompt=PROMPT, stream=stream))
    if stream:
        backend.path = "/stream"  # nginx's canned SSE body
    # accuracy-loop: the fast transport timing its reads on the loop's clock instead of the kernel's
    transport = make_transport(transport_name, url) if kernel_stamps else FastTransport(kernel_stamps=False)
    # nginx keeps connections alive after a stream (llama-server does not, and gets Connection: close).
    await transport.open(url, concurrency, 60.0, close_streams=False)
    try:
        warm = await run_level(LevelRun("bench", concurrency), transport, backend,
                               requests=concurrency * 4, duration_s=None)
        assert all(r.ok for r in warm.records), warm.records[0].error_message
        level = LevelRun("bench", concurrency)
        lag = LoopLagSampler().start()
        cpu0, t0 = _cpu_s(), time.perf_counter()
        await run_level(level, transport, backend, requests=requests, duration_s=None)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
        load = lag.stop()
    finally:
        await transport.close()
    failed = [r for r in level.records if not r.ok]
    if failed:
        print(f"first failure: {failed[0].error_kind}: {failed[0].error_message}", file=sys.stderr)
    lat = sorted((r.complete_ns - r.send_ns) / 1e6 for r in level.records if r.ok)
    events = sum(r.chunks or 0 for r in level.records) + len(level.records) if stream else None
    return {"done": len(level.records), "failed": len(failed), "wall_s": wall, "cpu_s": cpu,
            **({"events": events} if stream else {}), "latency_ms": lat if keep_latencies else [], "loop_lag_p99_ms": load.loop_lag_p99_ms, "loop_lag_max_ms": load.loop_lag_max_ms}


async def _bare_fast(url: str, body: bytes, requests: int, concurrency: int) -> dict:
    from loadgen.client.fast import FastTransport

    transport = FastTransport()
    await transport.open(url, concurrency, 60.0)
    bad = [0]

    async def loop(n: int) -> None:
        remaining = [n]

        async def task() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                r = await transport.request("POST", "/completion", body)
                if r.status != 200 or len(r.body) != len(CANNED_BODY):
                    bad[0] += 1

        await asyncio.gather(*(task() for _ in range(concurrency)))

    try:
        await loop(concurrency * 4)
        cpu0, t0 = _cpu_s(), time.perf_counter()
        await loop(requests)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        await transport.close()
    return {"done": requests, "failed": bad[0], "wall_s": wall, "cpu_s": cpu}


async def _sse(url: str, requests: int, concurrency: int, transport_name: str) -> dict:
    """Requests whose SSE bodies are split into events as the bytes arrive (a minimal splitter)."""
    from loadgen.client.registry import make_transport

    transport = make_transport(transport_name, url)
    # nginx keeps connections alive after a stream (llama-server does not, and gets Connection: close).
    await transport.open(url, concurrency, 60.0, close_streams=False)
    body = _engine_like_body()
    events = [0]
    bad = [0]

    def splitter():
        tail = [b""]

        def on_chunk(chunk: bytes, t_ns: int) -> None:
            data = tail[0] + chunk if tail[0] else chunk
            parts = data.split(b"\n\n")
            tail[0] = parts.pop()
            events[0] += len(parts)
        return on_chunk

    async def loop(n: int) -> None:
        remaining = [n]

        async def task() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                r = await transport.request("POST", "/stream", body, on_chunk=splitter())
                if r.status != 200:
                    bad[0] += 1

        await asyncio.gather(*(task() for _ in range(concurrency)))

    try:
        await loop(concurrency * 4)
        events[0] = 0
        cpu0, t0 = _cpu_s(), time.perf_counter()
        await loop(requests)
        wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    finally:
        await transport.close()
    if events[0] != requests * SSE_EVENTS:
        bad[0] += 1
    return {"done": requests, "failed": bad[0], "wall_s": wall, "cpu_s": cpu, "events": events[0]}


def child_main(variant: str, url: str, requests: int, concurrency: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    import uvloop

    from loadgen.run.loops import freeze_startup_heap
    freeze_startup_heap()  # as the CLI does before its first level

    if variant == "bare":
        coro = _bare(url, _engine_like_body(), requests, concurrency)
    elif variant == "bare-fast":
        coro = _bare_fast(url, _engine_like_body(), requests, concurrency)
    elif variant in ("engine", "engine+fast", "accuracy", "accuracy-loop", "stream-engine", "stream-engine+fast"):
        coro = _engine(url, requests, concurrency, "fast" if variant.endswith(("fast", "accuracy", "loop")) else "aiohttp",
                       stream=variant.startswith("stream"), keep_latencies=variant.startswith("accuracy"),
                       kernel_stamps=variant != "accuracy-loop")
    else:
        coro = _sse(url, requests, concurrency, variant.removeprefix("sse-"))
    print("RESULT " + json.dumps(uvloop.run(coro)), flush=True)


def run_child(variant: str, url: str, requests: int, concurrency: int, cpu: int | None) -> dict:
    return engine_overhead.run_child(variant, url, requests, concurrency, cpu, script=__file__)


# --------------------------------------------------------------------------------------------
# the 50 ms server (accuracy)
# --------------------------------------------------------------------------------------------

def hold_server_main(port: int, cpu: int | None) -> None:
    """Answer every request HOLD_S after it arrived; report its own lateness on exit.

    One thread, selectors, and a spin through the last millisecond. A request's arrival is the
    kernel's receive stamp (SO_TIMESTAMPNS), so the hold does not grow while the server is busy
    reading other requests, and due answers are sent between any two reads: each answer leaves
    within a few µs of its due time, so what the client measures beyond 50 ms is the client's
    (and loopback's). Lateness is reported as sent - due, on the wall clock the stamps are on.
    """
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(CANNED_BODY), CANNED_BODY.encode())
    so_timestampns, anc_size = 35, socket.CMSG_SPACE(16)
    now = functools.partial(time.clock_gettime_ns, time.CLOCK_REALTIME)
    hold_ns = int(HOLD_S * 1e9)
    listener = socket.create_server(("127.0.0.1", port), backlog=1024)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    buffers: dict[socket.socket, bytearray] = {}
    due: list[tuple[int, int, socket.socket]] = []
    late_us: list[float] = []
    seq = 0

    def answer_due() -> None:
        t = now()
        while due and due[0][0] <= t:
            when, _, conn = heapq.heappop(due)
            try:
                conn.send(reply)
            except OSError:
                continue
            t = now()
            late_us.append((t - when) / 1e3)

    print("READY", flush=True)
    import signal
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *a: stop.__setitem__(0, True))
    while not stop[0]:
        answer_due()
        timeout = 0.05 if not due else max(0.0, (due[0][0] - now()) / 1e9 - 0.001)
        for key, _ in sel.select(timeout):
            answer_due()
            sock = key.fileobj
            if sock is listener:
                try:
                    while True:
                        conn, _ = listener.accept()
                        conn.setblocking(False)
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        conn.setsockopt(socket.SOL_SOCKET, so_timestampns, 1)
                        sel.register(conn, selectors.EVENT_READ)
                        buffers[conn] = bytearray()
                except BlockingIOError:
                    pass
                continue
            try:
                data, anc, _, _ = sock.recvmsg(65536, anc_size)
            except OSError:
                data, anc = b"", []
            if not data:
                sel.unregister(sock)
                sock.close()
                buffers.pop(sock, None)
                continue
            arrived = now()
            for level, kind, stamp in anc:
                if level == socket.SOL_SOCKET and kind == so_timestampns:
                    sec, nsec = struct.unpack_from("qq", stamp)
                    arrived = min(arrived, sec * 1_000_000_000 + nsec)
            buf = buffers[sock]
            buf += data
            while True:  # every complete request in the buffer
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    break
                head = bytes(buf[:end]).lower()
                i = head.find(b"content-length:")
                length = int(head[i + 15:].split(b"\r\n", 1)[0]) if i >= 0 else 0
                if len(buf) < end + 4 + length:
                    break
                del buf[:end + 4 + length]
                seq += 1
                heapq.heappush(due, (arrived + hold_ns, seq, sock))
    late_us.sort()
    n = len(late_us)
    print("RESULT " + json.dumps({"answers": n, "overshoot_p99_us": late_us[int(n * 0.99)] if n else None,
                                  "overshoot_max_us": late_us[-1] if n else None}), flush=True)


def accuracy(requests: int, client_cpu: int | None, server_cpu: int | None, concurrency: int = 256) -> dict:
    """The 50 ms server against the fast transport twice: reads timed by the kernel (the default)
    and on the loop's clock, in that order, against one server process."""
    port = free_port()
    cmd = [sys.executable, os.path.abspath(__file__), "--_hold_server", str(port)]
    if server_cpu is not None:
        cmd += ["--_cpu", str(server_cpu)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    clients = {}
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "READY"
        for variant in ("accuracy", "accuracy-loop"):
            clients[variant] = run_child(variant, f"http://127.0.0.1:{port}", requests, concurrency, client_cpu)
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    result = {"server": json.loads(lines[-1][len("RESULT "):]) if lines else {}}
    for variant, client in clients.items():
        lat = client.get("latency_ms") or [float("nan")]
        result[variant] = {"client": client, "p50_excess_ms": lat[len(lat) // 2] - HOLD_S * 1e3,
                           "p99_excess_ms": lat[int(len(lat) * 0.99)] - HOLD_S * 1e3,
                           "max_excess_ms": lat[-1] - HOLD_S * 1e3}
    return result


# --------------------------------------------------------------------------------------------
# parent
# --------------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="requests per variant per round")
    ap.add_argument("--stream-requests", type=int, default=5_000, help="SSE requests per variant per round")
    ap.add_argument("--accuracy-requests", type=int, default=10_240, help="requests of the accuracy run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", default="nonstream,stream,accuracy")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    ap.add_argument("--_url", help=argparse.SUPPRESS)
    ap.add_argument("--_cpu", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--_hold_server", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._hold_server:
        hold_server_main(args._hold_server, args._cpu)
        return 0
    if args._child:
        child_main(args._child, args._url, args.requests, args.concurrency, args._cpu)
        return 0

    parts = set(args.parts.split(","))
    client_cpu, server_cpu = pick_cpus()
    failed = 0
    results: dict[str, list[dict]] = {}
    if parts & {"nonstream", "stream"}:
        nginx = StreamingNginx(ensure_nginx(), server_cpu)
        nginx.start()
        variants = [*(NONSTREAM if "nonstream" in parts else ()), *(STREAM if "stream" in parts else ())]
        results = {v: [] for v in variants}
        print(f"nginx {nginx.url} (cpu {server_cpu}), client cpu {client_cpu}, concurrency {args.concurrency}, "
              f"{args.rounds} rounds; canned body {len(CANNED_BODY)} B, SSE body {len(SSE_BODY)} B "
              f"({SSE_EVENTS} events)\n", flush=True)
        try:
            for rnd in range(args.rounds):
                order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                for v in order:
                    n = args.stream_requests if v.startswith(("sse", "stream")) else args.requests
                    r = run_child(v, nginx.url, n, args.concurrency, client_cpu)
                    results[v].append(r)
                    failed += r["failed"]
                    extra = (f"{r['events'] / r['wall_s']:>10,.0f} events/s" if "events" in r else "")
                    print(f"  round {rnd + 1} {v:<12} {r['done']:>7,} req {r['failed']} failed "
                          f"{r['done'] / r['wall_s']:>8,.0f} req/s {r['cpu_s'] / max(r['done'], 1) * 1e6:>7.1f} "
                          f"CPU µs/req{extra}", flush=True)
        finally:
            nginx.stop()
        print(f"\nmedian of {args.rounds} rounds, concurrency {args.concurrency}, client pinned to one core:")
        print(f"{'variant':<13}{'req/s':>10}{'CPU µs/req':>12}{'events/s':>12}{'CPU µs/event':>14}")
        for v, rs in results.items():
            rps = statistics.median(r["done"] / r["wall_s"] for r in rs)
            us = statistics.median(r["cpu_s"] / max(r["done"], 1) * 1e6 for r in rs)
            if "events" in rs[0]:
                eps = statistics.median(r["events"] / r["wall_s"] for r in rs)
                ue = statistics.median(r["cpu_s"] / max(r["events"], 1) * 1e6 for r in rs)
                print(f"{v:<13}{rps:>10,.0f}{us:>12.1f}{eps:>12,.0f}{ue:>14.2f}")
            else:
                print(f"{v:<13}{rps:>10,.0f}{us:>12.1f}")
        print("targets: engine+fast <= 60 CPU µs/req; sse-fast >= 300,000 events/s")
    if "accuracy" in parts:
        print(f"\naccuracy: a server that answers {HOLD_S * 1e3:.0f} ms after each request, concurrency 256, "
              f"{args.accuracy_requests:,} requests through run_level + the fast transport", flush=True)
        acc = accuracy(args.accuracy_requests, client_cpu, server_cpu)
        for variant, label in (("accuracy", "reads timed by the kernel (default)"),
                               ("accuracy-loop", "reads timed by the event loop")):
            a, c = acc[variant], acc[variant]["client"]
            failed += c["failed"]
            print(f"  {label}: latency - 50 ms p50 {a['p50_excess_ms']:.3f} ms, p99 {a['p99_excess_ms']:.3f} ms, "
                  f"max {a['max_excess_ms']:.3f} ms")
            if c.get("loop_lag_p99_ms") is not None:
                print(f"      the client's event-loop lag: p99 {c['loop_lag_p99_ms']:.2f} ms, "
                      f"max {c['loop_lag_max_ms']:.2f} ms, client CPU {c['cpu_s'] / c['wall_s']:.0%} of a core")
        print("  target: p99 < 1 ms")
        s = acc["server"]
        if s:
            print(f"  the server's own lateness: p99 {s['overshoot_p99_us']:.0f} µs, max {s['overshoot_max_us']:.0f} µs "
                  f"over {s['answers']:,} answers")
    load = os.getloadavg()[0]
    if load > (os.cpu_count() or 1) + 0.5:
        print(f"note: load average {load:.1f} on {os.cpu_count()} CPUs: other processes shared the cores")
    if failed:
        print("\nFAILED: some requests did not succeed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
