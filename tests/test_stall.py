"""--stall-timeout as llama-server answers: its headers come before the prefill of a request it has
begun (build 11434: headers at 7 ms, the first token 3 s later on a 1,000-token prompt), so the stall
clock starts at the body's first byte. A stand-in server sends the headers at once, then (prefill)
nothing for PREFILL_S, then the stream, whose events are GAP_S apart: a quiet prefill is never a stall,
a quiet body is, on both transports. (tests/test_faults.py holds the simulator's stalls.)"""

from __future__ import annotations

import asyncio

import pytest

from httpfixture import response
from loadgen.results.reader import load_records
from test_transport_fast import ThreadedServer

PREFILL_S = 0.8
EVENT = b'data: {"content":"hi","stop":false}\n\n'
FINAL = (b'data: {"content":"","stop":true,"tokens_predicted":2,"stop_type":"limit","id_slot":0,'
         b'"timings":{"prompt_n":4,"prompt_ms":800.0,"predicted_n":2,"predicted_ms":1.0,"cache_n":0}}\n\n')


def streaming(gap_s: float):
    """Headers at once, PREFILL_S of nothing, the first event, `gap_s`, the rest; the connection closed."""
    async def handler(request, writer):
        if request.path == "/health":
            writer.write(response(b'{"status":"ok"}'))
            await writer.drain()
            return True
        if request.path != "/completion":
            writer.write(response(b"not here", "404 Not Found"))
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(PREFILL_S)
        writer.write(EVENT)
        await writer.drain()
        await asyncio.sleep(gap_s)
        writer.write(EVENT + FINAL)
        await writer.drain()
        return False
    return handler


# (the gap between events, the error kind every request must end with: None = ok), written first
@pytest.mark.parametrize("transport", ["fast", "aiohttp"])
@pytest.mark.parametrize("gap_s, kind", [(0.01, None), (1.5, "stalled")])
def test_a_quiet_prefill_is_no_stall_a_quiet_body_is(loadgen, tmp_path, transport, gap_s, kind):
    with ThreadedServer(streaming(gap_s)) as server:
        code, _, err = loadgen("sweep", "--url", server.url, "--concurrency", "2", "--requests", "2", "--warmup", "0",
                               "--stream", "--stall-timeout", "0.3", "--timeout", "10", "--transport", transport,
                               "--no-histograms", "--wait-ready", "1", "--output", tmp_path / "run")
    assert code in (0, 1), err
    records = load_records(tmp_path / "run")
    assert len(records) == 2
    assert {r.error_kind for r in records} == {kind}, [r.error_message for r in records]
    if kind == "stalled":
        assert all("HTTP 200" in r.error_message and "0.3 s" in r.error_message for r in records)
        # found in about the stall timeout after the first event, not at --timeout's 10 s
        assert all((r.complete_ns - r.start_ns) / 1e9 < PREFILL_S + 1.2 for r in records)
