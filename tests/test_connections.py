"""Connections: a level's are opened before its clock starts, and a request that opens one says so.

Transport level against the byte-exact fixture server (both transports, plain and TLS); a sweep
against Debian's nginx: a server that answers every request 50 ms after it arrives (the echo
module) and one that closes the connection after every response (`keepalive_timeout 0`). nginx
logs each request's connection serial number, so the connections the client used are counted on
the server's side.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest
import uvloop

from httpfixture import RawHttpServer, Request, response, self_signed_tls
from loadgen.client.aiohttp_transport import AiohttpTransport
from loadgen.client.fast import FastTransport
from loadgen.core.records import RequestRecord
from loadgen.run.schedule import connections_ahead
from servers import LOADGEN, refused_port, start_nginx

TRANSPORTS = {"fast": FastTransport, "aiohttp": AiohttpTransport}

# A llama-server /completion answer, as the echo module sends it.
COMPLETION = ('{"content":"x","tokens_predicted":1,"stop":true,"stop_type":"limit","id_slot":0,'
              '"timings":{"prompt_n":1,"prompt_ms":0.1,"predicted_n":1,"predicted_ms":0.1,'
              '"predicted_per_second":10000.0,"cache_n":0}}')
# Answers every request (/health too) 50 ms after it arrived.
ECHO_50MS = f"location / {{ default_type application/json; echo_sleep 0.05; echo '{COMPLETION}'; }}"
INSTANT = f"location / {{ default_type application/json; return 200 '{COMPLETION}'; }}"


def run(coro):
    return uvloop.run(coro)


def ok_handler():
    async def handler(request: Request, writer: asyncio.StreamWriter) -> bool:
        writer.write(response(b"ok"))
        await writer.drain()
        return True
    return handler


# --- the rule: how many connections a level opens ahead (expected answers written first) -------

@pytest.mark.parametrize("concurrency, rate, requests, latency_s, expected", [
    (256, None, None, None, 256),     # closed loop: its concurrency
    (256, None, 100, None, 100),      # ... but never more than its request budget
    (1, None, None, 0.5, 1),          # latency plays no part in a closed loop
    (0, 10.0, None, 0.5, 11),         # open loop: 2 × 10 req/s × 0.5 s + 1
    (0, 10.0, None, None, 1),         # no latency seen yet: one
    (0, 100.0, 20, 1.0, 20),          # the budget caps it
    (8, 100.0, None, 1.0, 8),         # so does --max-in-flight
    (0, 0.5, None, 0.1, 2),           # ceil(0.1) + 1
])
def test_connections_ahead(concurrency, rate, requests, latency_s, expected):
    assert connections_ahead(concurrency, rate, requests=requests, latency_s=latency_s) == expected


# --- the transports ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_request_that_opens_its_connection_says_how_long_that_took(kind):
    async def main():
        async with RawHttpServer(ok_handler()) as server:
            transport = TRANSPORTS[kind]()
            await transport.open(server.url, 4, 5.0)
            try:
                first = await transport.request("POST", "/x", b"{}")
                second = await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
            return first, second, server.connections
    first, second, connections = run(main())
    assert connections == 1
    assert first.connect_us is not None and 0 <= first.connect_us < 5_000_000
    assert second.connect_us is None  # reused
    assert first.tls_us is None and second.tls_us is None  # plain TCP


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_connect_ahead_opens_the_pool_before_any_request(kind):
    async def main():
        async with RawHttpServer(ok_handler()) as server:
            transport = TRANSPORTS[kind]()
            await transport.open(server.url, 6, 5.0)
            try:
                opened = await transport.connect_ahead(8)  # more than the pool may hold
                again = await transport.connect_ahead(4)  # already open: nothing new
                answers = await asyncio.gather(*(transport.request("POST", "/x", b"{}") for _ in range(6)))
            finally:
                await transport.close()
            return opened, again, answers, server.connections
    opened, again, answers, connections = run(main())
    assert opened == 6 and again >= 4
    assert connections == 6
    assert all(a.status == 200 and a.connect_us is None for a in answers)


def test_connect_ahead_to_a_refused_port_opens_none_and_raises_nothing():
    async def main(port):
        transport = FastTransport()
        await transport.open(f"http://127.0.0.1:{port}", 4, 2.0)
        try:
            return await transport.connect_ahead(4)
        finally:
            await transport.close()
    with refused_port() as port:
        assert run(main(port)) == 0


def test_tls_connect_time_holds_the_handshake(tmp_path):
    context, _ = self_signed_tls(tmp_path)

    async def main(kind):
        async with RawHttpServer(ok_handler(), tls=context) as server:
            transport = TRANSPORTS[kind]()
            await transport.open(server.url, 2, 5.0, insecure=True)
            try:
                return await transport.request("POST", "/x", b"{}")
            finally:
                await transport.close()
    fast, slow = run(main("fast")), run(main("aiohttp"))
    assert fast.status == 200 and fast.tls_us is not None and fast.connect_us is not None
    assert 0 < fast.tls_us <= fast.connect_us
    assert slow.status == 200 and slow.connect_us is not None and slow.tls_us is None  # aiohttp cannot tell


# --- sweeps against nginx ---------------------------------------------------------------------

def _sweep(url: str, out: Path, *args: str) -> tuple[dict, list[RequestRecord], str]:
    proc = subprocess.run([*LOADGEN, "sweep", "--url", url, "--warmup", "0", "--output", str(out), *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "run.json").read_text())
    recs = [RequestRecord.from_dict(json.loads(line)) for line in (out / "requests.jsonl").read_text().splitlines()]
    return doc, recs, proc.stdout + proc.stderr


def test_a_levels_first_requests_do_not_pay_for_connecting(tmp_path):
    """c=256 against the 50 ms server: the level's requests go out on 256 connections opened before
    its clock started (it used to open them with its first round, which then took 83-87 ms where
    every later request took under 60). What that does to the latencies is measured by
    benchmarks/connect_ahead.py; here, that no request of the level connected, by its own record and
    by the server's count of the connections that carried them."""
    with start_nginx(ECHO_50MS, modules=("ngx_http_echo_module",)) as nginx:
        doc, recs, _ = _sweep(nginx.url, tmp_path / "run", "--concurrency", "256", "--duration", "2")
        log = [row for row in nginx.requests_log() if row[2] == "/completion"]
    level = doc["targets"][0]["levels"][0]
    assert level["connections_opened"] == 0 and level["requests_failed"] == 0
    assert "connect_ms" not in level or level["connect_ms"] is None
    assert len(recs) > 256 and all(r.connect_us is None for r in recs)
    assert len({conn for conn, _, _ in log}) == 256  # the server saw 256 connections carry them all
    assert len(log) == len(recs)


def test_the_aiohttp_transport_opens_a_levels_connections_ahead_too(tmp_path):
    """aiohttp opens connections only for requests: 64 GETs of /health leave 64 open for the level.
    (No latency claim: at this concurrency aiohttp's own CPU sets the first round's latency.)"""
    with start_nginx(ECHO_50MS, modules=("ngx_http_echo_module",)) as nginx:
        doc, recs, _ = _sweep(nginx.url, tmp_path / "run", "--concurrency", "64", "--requests", "256",
                              "--transport", "aiohttp")
        log = nginx.requests_log()
    level = doc["targets"][0]["levels"][0]
    assert level["connections_opened"] == 0 and level["requests_ok"] == 256
    completions = {conn for conn, _, uri in log if uri == "/completion"}
    assert len(completions) == 64
    assert completions <= {conn for conn, _, uri in log if uri == "/health"}  # opened by the GETs


def test_levels_after_the_first_reuse_its_connections(tmp_path):
    with start_nginx(INSTANT) as nginx:
        doc, recs, _ = _sweep(nginx.url, tmp_path / "run", "--concurrency", "4,8", "--requests", "200")
        log = [row for row in nginx.requests_log() if row[2] == "/completion"]
    assert [lv["connections_opened"] for lv in doc["targets"][0]["levels"]] == [0, 0]
    assert len({conn for conn, _, _ in log}) == 8


def test_a_server_that_closes_after_every_response_costs_a_connect_per_request(tmp_path):
    with start_nginx(INSTANT, http="keepalive_timeout 0;") as nginx:
        doc, recs, out = _sweep(nginx.url, tmp_path / "run", "--concurrency", "8", "--requests", "64")
        log = [row for row in nginx.requests_log() if row[2] == "/completion"]
    level = doc["targets"][0]["levels"][0]
    assert level["requests_ok"] == 64
    # The 8 connections opened ahead carried the first 8; each later request opened its own.
    assert level["connections_opened"] == 64 - 8
    assert level["connect_ms"]["count"] == 56 and level["connect_ms"]["p50"] > 0
    assert sum(r.connect_us is not None for r in recs) == 56
    assert len(log) == 64 and all(index == 1 for _, index, _ in log)  # one request per connection
    assert len({conn for conn, _, _ in log}) == 64
    assert "56 of 64 requests opened a connection, connect p50" in " ".join(out.split())


@pytest.mark.real
def test_llama_server_costs_a_connect_per_streamed_request_and_none_otherwise(tmp_path):
    """llama-server keeps a non-streamed request's connection alive and closes a stream's: the
    records say so, request by request."""
    from servers import start_llama_server

    server = start_llama_server("conn", 2, tmp_path)
    try:
        plain, _, _ = _sweep(server.url, tmp_path / "plain", "--concurrency", "2", "--requests", "6", "--n-predict", "4")
        streamed, recs, out = _sweep(server.url, tmp_path / "stream", "--concurrency", "2", "--requests", "6",
                                     "--n-predict", "4", "--stream")
    finally:
        server.stop()
    assert plain["targets"][0]["levels"][0]["connections_opened"] == 0
    level = streamed["targets"][0]["levels"][0]
    assert level["requests_ok"] == 6
    assert level["connections_opened"] == 4  # the 2 opened ahead carried the first two streams
    assert sorted(r.seq for r in recs if r.connect_us is not None) == [2, 3, 4, 5]
    assert "4 of 6 requests opened a connection" in " ".join(out.split())
