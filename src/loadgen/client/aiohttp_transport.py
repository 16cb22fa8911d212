"""The aiohttp transport: one keep-alive `ClientSession` per target, and the one that speaks to proxies.

Reads are timed on the loop's clock, as aiohttp hands the bytes over. `--transport aiohttp` picks
it, and `registry.make_transport` falls back to it when the environment sets a proxy for a target.
A request that opened its connection learns how long that took from aiohttp's tracing signals
(TCP and TLS together: aiohttp does not tell the handshake apart).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from ..core import records
from ..core.baseurl import BaseUrl
from ..core.clock import now_ns
from .transport import (
    ChunkCallback,
    HttpResponse,
    TransportError,
    connect_error,
    connect_reason,
    reason_of,
    tls_context,
)

_CLOSE = {"Connection": "close"}


class _Connecting:
    """One request's connect, timed by aiohttp's tracing signals."""

    __slots__ = ("start_ns", "connect_us")

    def __init__(self) -> None:
        self.start_ns = 0
        self.connect_us: int | None = None


async def _connect_started(session, ctx, params) -> None:
    if ctx.trace_request_ctx is not None:  # None: a connect_ahead request, not timed
        ctx.trace_request_ctx.start_ns = now_ns()


async def _connect_ended(session, ctx, params) -> None:
    timing = ctx.trace_request_ctx
    if timing is not None:
        timing.connect_us = (now_ns() - timing.start_ns) // 1000


def _connect_tracing() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_connection_create_start.append(_connect_started)
    config.on_connection_create_end.append(_connect_ended)
    return config


class _Stalled(Exception):
    """A response that began and then went quiet for longer than the stall timeout."""


class AiohttpTransport:
    """aiohttp with one keep-alive `ClientSession` per target, through `proxy` when one is given."""

    read_clock = "loop"

    def __init__(self, proxy: str | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._base: BaseUrl | None = None
        self._urls: dict[str, URL] = {}
        self._close_streams = True
        self._proxy = proxy
        self._hostport = ""
        self._stall_s: float | None = None

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True, stall_s: float | None = None) -> None:
        self._close_streams = close_streams
        self._stall_s = stall_s
        self._base = BaseUrl.parse(base_url)
        self._urls = {}
        self._hostport = urlsplit(base_url).netloc
        connector = aiohttp.TCPConnector(limit=max(0, max_connections), limit_per_host=0,
                                         keepalive_timeout=60, enable_cleanup_closed=False,
                                         ssl=tls_context(insecure) if base_url.startswith("https:") else True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            headers={"Content-Type": "application/json", **(headers or {})},
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            trace_configs=[_connect_tracing()],
        )
        self._limit = max(0, max_connections)

    async def connect_ahead(self, connections: int) -> int:
        """aiohttp opens connections only for requests: `connections` concurrent GETs of /health
        (cheap on llama-server; any answer will do) leave that many idle keep-alive connections."""
        assert self._session is not None, "open() first"
        session = self._session
        n = connections if not self._limit else min(connections, self._limit)

        async def one() -> bool:
            try:
                async with session.get(self._url("/health"), proxy=self._proxy) as resp:
                    await resp.read()
                    return True
            except (TimeoutError, aiohttp.ClientError):
                return False

        return sum(await asyncio.gather(*(one() for _ in range(n))))

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse:
        """One attempt, never retried: a request the server reset or dropped is recorded as such."""
        assert self._session is not None, "open() first"
        timing = _Connecting()
        try:
            # llama-server closes the connection after every streamed response although it announces
            # keep-alive; a next request sent on it races that close and dies unanswered. So a
            # stream asks for `Connection: close` and its connection is not reused. (Retrying such
            # a request instead would also hide a server that resets requests it has read.)
            async with self._session.request(method, self._url(path), data=body, proxy=self._proxy,
                                             headers=_CLOSE if on_chunk is not None and self._close_streams
                                             else None, trace_request_ctx=timing) as resp:
                headers_ns = now_ns()
                if self._stall_s:
                    data = await self._read_watched(resp, on_chunk, self._stall_s)
                elif on_chunk is None:
                    data = await resp.read()
                else:
                    data = b""
                    async for chunk in resp.content.iter_any():
                        on_chunk(chunk, now_ns())
                return HttpResponse(resp.status, resp.headers, headers_ns, now_ns(), data, timing.connect_us)
        except _Stalled as exc:
            raise TransportError(records.STALLED, f"HTTP {exc.args[0]}: the body began, then nothing came for "
                                                  f"{self._stall_s:g} s (--stall-timeout)") from exc
        except TimeoutError as exc:
            raise TransportError(records.TIMEOUT, "no complete response within the timeout") from exc
        except aiohttp.ClientError as exc:
            raise self._transport_error(exc) from exc

    @staticmethod
    async def _read_watched(resp: aiohttp.ClientResponse, on_chunk: ChunkCallback | None, stall_s: float) -> bytes:
        """The body (or its chunks to `on_chunk`), each read after the first given `stall_s` from the
        last one: one timer moved per read, armed only when a stall timeout is asked for. The wait for
        the body's first byte is --timeout's (llama-server sends its headers before the prefill)."""
        loop = asyncio.get_running_loop()
        parts: list[bytes] = []

        def take(chunk: bytes) -> None:
            if on_chunk is None:
                parts.append(chunk)
            else:
                on_chunk(chunk, now_ns())

        chunk = await resp.content.readany()
        if not chunk:
            return b""
        take(chunk)
        try:
            async with asyncio.timeout_at(loop.time() + stall_s) as watch:
                while chunk := await resp.content.readany():
                    watch.reschedule(loop.time() + stall_s)
                    take(chunk)
        except TimeoutError as exc:
            raise _Stalled(resp.status) from exc
        return b"".join(parts)

    def _url(self, path: str) -> URL:
        """The path under the base URL's prefix, with its query, sent exactly as the fast transport does."""
        url = self._urls.get(path)
        if url is None:
            assert self._base is not None, "open() first"
            url = self._urls[path] = URL(self._base.url(path), encoded=True)
        return url

    def _transport_error(self, exc: aiohttp.ClientError) -> TransportError:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return TransportError(records.CONNECT_ERROR, connect_reason(exc.certificate_error, self._hostport))
        if isinstance(exc, aiohttp.ClientConnectorError):
            return connect_error(exc.os_error, self._hostport)
        return TransportError(records.DISCONNECTED, reason_of(exc))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
