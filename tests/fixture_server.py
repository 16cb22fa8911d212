"""A tiny programmable HTTP server for engine and streaming tests (loopback only).

It answers the three completion APIs with canned bodies or canned SSE streams, can stall chosen
requests, and records the headers it was sent. Tests set `behaviour` to pick what it does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

TIMINGS = {"prompt_n": 12, "prompt_ms": 4.0, "predicted_n": 8, "predicted_ms": 16.0,
           "predicted_per_second": 437.5, "cache_n": 0}
COMPLETION = {"content": "x" * 8, "stop": True, "tokens_predicted": 8, "stop_type": "limit", "id_slot": 0,
              "timings": TIMINGS}


def sse(*payloads: object) -> bytes:
    """`data: <json>\\n\\n` per payload; bytes and str are sent as they are (for [DONE], pings, noise)."""
    out = b""
    for p in payloads:
        if isinstance(p, bytes):
            out += p
        elif isinstance(p, str):
            out += f"data: {p}\n\n".encode()
        else:
            out += b"data: " + json.dumps(p, separators=(",", ":")).encode() + b"\n\n"  # compact, as llama-server
    return out


def completion_stream(tokens: int = 8) -> list[bytes]:
    """A /completion stream as llama-server sends it: content events, then stop:true with timings."""
    events = [sse({"content": "x", "stop": False, "tokens_predicted": i + 1}) for i in range(tokens)]
    events.append(sse({"content": "", "stop": True, "tokens_predicted": tokens, "stop_type": "limit",
                       "timings": {**TIMINGS, "predicted_n": tokens}}))
    return events


def chat_stream(tokens: int = 8) -> list[bytes]:
    events = [sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})]
    events += [sse({"choices": [{"index": 0, "delta": {"content": "y"}}]}) for _ in range(tokens)]
    events.append(sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    events.append(sse({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": tokens,
                                                "total_tokens": 12 + tokens}}))
    events.append(sse("[DONE]"))
    return events


@dataclass
class Behaviour:
    """What the next requests get. `events` (a list of byte strings, one write each) means SSE."""

    status: int = 200
    body: dict | None = None
    events: list[bytes] | None = None
    event_gap_s: float = 0.0
    stall_s: Callable[[int], float] = lambda n: 0.0  # by request number (0-based): seconds before answering


@dataclass
class FixtureServer:
    behaviour: Behaviour = field(default_factory=Behaviour)
    requests: int = 0
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    seen_bodies: list[bytes] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        n = self.requests
        self.requests += 1
        self.seen_headers.append(dict(request.headers))
        self.seen_bodies.append(await request.read())
        b = self.behaviour
        stall = b.stall_s(n)
        if stall:
            await asyncio.sleep(stall)
        if b.events is None:
            return web.json_response(b.body if b.body is not None else COMPLETION, status=b.status)
        resp = web.StreamResponse(status=b.status, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(b.events):
            if i and b.event_gap_s:
                await asyncio.sleep(b.event_gap_s)
            await resp.write(event)
        await resp.write_eof()
        return resp

    async def _side(self, request: web.Request) -> web.Response:
        self.seen_headers.append(dict(request.headers))
        if request.path == "/health":
            return web.json_response({"status": "ok"})
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "fixture-model"}]})
        if request.path == "/metrics":
            return web.Response(text="llamacpp:requests_deferred 0\nllamacpp:requests_processing 0\n")
        return web.json_response({"error": {"code": 404, "message": "not here"}}, status=404)

    async def start(self) -> FixtureServer:
        app = web.Application()
        for path in ("/completion", "/v1/completions", "/v1/chat/completions"):
            app.router.add_post(path, self._handle)
        app.router.add_get("/{tail:.*}", self._side)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
