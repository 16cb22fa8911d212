"""An in-process transport for tests (httpx's MockTransport, for loadgen's `Transport`): every request
goes to a handler function instead of a socket, so the engine, the backends and the records can be
tested with no server, no port and no thread. For the quick tier (tests/conftest.py).

    transport = MockTransport(lambda req: FakeAnswer(200, json_body={"content": "hi", ...}))

A handler gets a `FakeRequest` and returns a `FakeAnswer` (or raises `TransportError`, as a failed
connection would); it may be a coroutine function to make time pass (`await asyncio.sleep`).
A streamed answer's `chunks` are handed to the caller's `on_chunk` one by one, each with its time.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loadgen.client.transport import ChunkCallback, HttpResponse
from loadgen.core.clock import now_ns


@dataclass(frozen=True)
class FakeRequest:
    method: str
    path: str
    body: bytes
    streamed: bool  # the caller reads the body chunk by chunk

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class FakeAnswer:
    status: int = 200
    body: bytes = b""
    chunks: tuple[bytes, ...] = ()  # a streamed body in the pieces it arrives in; `body` when empty
    headers: Mapping[str, str] = field(default_factory=lambda: {"content-type": "application/json"})

    @classmethod
    def json(cls, status: int, doc: Any) -> FakeAnswer:
        return cls(status, json.dumps(doc).encode())


Handler = Callable[[FakeRequest], FakeAnswer | Awaitable[FakeAnswer]]


class MockTransport:
    """`Transport` over a handler. `requests` keeps what was asked, in order, for the test to read."""

    read_clock = "loop"

    def __init__(self, handler: Handler):
        self.handler = handler
        self.requests: list[FakeRequest] = []
        self.base_url: str | None = None
        self.closed = False

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True) -> None:
        self.base_url = base_url

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse:
        asked = FakeRequest(method, path, body, on_chunk is not None)
        self.requests.append(asked)
        answer = self.handler(asked)
        if inspect.isawaitable(answer):
            answer = await answer
        headers_ns = now_ns()
        if on_chunk is not None:
            for chunk in answer.chunks or (answer.body,):
                await asyncio.sleep(0)  # another request may run between two reads, as on a socket
                on_chunk(chunk, now_ns())
            return HttpResponse(answer.status, answer.headers, headers_ns, now_ns(), b"")
        body = answer.body or b"".join(answer.chunks)
        return HttpResponse(answer.status, answer.headers, headers_ns, now_ns(), body)

    async def connect_ahead(self, connections: int) -> int:
        return connections

    async def close(self) -> None:
        self.closed = True
