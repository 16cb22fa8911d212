"""The HTTP client behind a small interface, so a faster transport can sit beside aiohttp.

A transport opens a connection pool to one base URL, sends one request at a time per caller,
and reports the status, headers and body with arrival times on `clock.now_ns`. It knows nothing
about LLM APIs (that is a backend's job) nor about scheduling (that is the engine's).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from . import records
from .clock import now_ns


class TransportError(Exception):
    """A request that got no complete HTTP response. `kind` is one of the records' error kinds."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]
    headers_ns: int  # status line and headers received
    complete_ns: int  # last body byte received
    body: bytes  # empty when the caller consumed the body through `on_chunk`


ChunkCallback = Callable[[bytes, int], None]


class Transport(Protocol):
    """`max_connections` 0 means no limit (open loop without an in-flight cap)."""

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None) -> None: ...

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse: ...

    async def close(self) -> None: ...


class AiohttpTransport:
    """aiohttp with one keep-alive `ClientSession` per target."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._base = ""

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None) -> None:
        self._base = base_url.rstrip("/")
        connector = aiohttp.TCPConnector(limit=max(0, max_connections), limit_per_host=0,
                                         keepalive_timeout=60, enable_cleanup_closed=False)
        reuse = aiohttp.TraceConfig()
        reuse.on_connection_reuseconn.append(_mark_reused)
        self._session = aiohttp.ClientSession(
            connector=connector,
            trace_configs=[reuse],
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            headers={"Content-Type": "application/json", **(headers or {})},
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse:
        ctx = {"reused": False, "received": False}
        try:
            return await self._request(method, path, body, on_chunk, ctx)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            # A pooled keep-alive connection the server had already closed: nothing came back, so
            # the request is sent again, once, on a fresh connection. (llama-server closes the
            # connection after every streamed response although it announces keep-alive.)
            if not ctx["reused"] or ctx["received"] or isinstance(exc, aiohttp.ClientConnectorError):
                raise _transport_error(exc) from exc
        try:
            return await self._request(method, path, body, on_chunk, {"reused": False, "received": False})
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc

    async def _request(self, method: str, path: str, body: bytes, on_chunk: ChunkCallback | None,
                       ctx: dict[str, bool]) -> HttpResponse:
        assert self._session is not None, "open() first"
        try:
            async with self._session.request(method, self._base + path, data=body, trace_request_ctx=ctx) as resp:
                ctx["received"] = True
                headers_ns = now_ns()
                if on_chunk is None:
                    data = await resp.read()
                else:
                    data = b""
                    async for chunk in resp.content.iter_any():
                        on_chunk(chunk, now_ns())
                return HttpResponse(resp.status, resp.headers, headers_ns, now_ns(), data)
        except asyncio.TimeoutError as exc:
            raise TransportError(records.TIMEOUT, "no complete response within the timeout") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            raise  # request() decides whether it is worth a second try
        except aiohttp.ClientError as exc:
            raise _transport_error(exc) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _mark_reused(session: object, ctx: object, params: object) -> None:
    trace_ctx = getattr(ctx, "trace_request_ctx", None)
    if isinstance(trace_ctx, dict):
        trace_ctx["reused"] = True


def _transport_error(exc: aiohttp.ClientError) -> TransportError:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportError(records.CONNECT_ERROR, _reason(exc))
    return TransportError(records.DISCONNECTED, _reason(exc))


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
