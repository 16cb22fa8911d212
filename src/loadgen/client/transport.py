"""The HTTP client behind a small interface, so a faster transport can sit beside aiohttp.

A transport opens a connection pool to one base URL, sends one request at a time per caller,
and reports the status, headers and body with arrival times on `clock.now_ns`. It knows nothing
about LLM APIs (that is a backend's job) nor about scheduling (that is the engine's).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from .core import records
from .core.clock import now_ns


class TransportError(Exception):
    """A request that got no complete HTTP response. `kind` is one of the records' error kinds."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(slots=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # names case-insensitive
    headers_ns: int  # status line and headers received
    complete_ns: int  # last body byte received
    body: bytes  # empty when the caller consumed the body through `on_chunk`


ChunkCallback = Callable[[bytes, int], None]


class Transport(Protocol):
    """`max_connections` 0 means no limit (open loop without an in-flight cap).

    `read_clock` says what a read's time is: "kernel" (the kernel's receive stamp) or "loop" (when
    the event loop handed the bytes over).
    """

    read_clock: str

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True) -> None:
        """`close_streams`: streamed requests ask for `Connection: close` (for servers that close
        the connection after a stream anyway, like llama-server; elsewhere it costs a connect)."""
        ...

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse: ...

    async def close(self) -> None: ...


_CLOSE = {"Connection": "close"}


class AiohttpTransport:
    """aiohttp with one keep-alive `ClientSession` per target, through `proxy` when one is given."""

    read_clock = "loop"

    def __init__(self, proxy: str | None = None) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._base = ""
        self._close_streams = True
        self._proxy = proxy
        self._hostport = ""

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True) -> None:
        self._close_streams = close_streams
        self._base = base_url.rstrip("/")
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
        )

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse:
        """One attempt, never retried: a request the server reset or dropped is recorded as such."""
        assert self._session is not None, "open() first"
        try:
            # llama-server closes the connection after every streamed response although it announces
            # keep-alive; a next request sent on it races that close and dies unanswered. So a
            # stream asks for `Connection: close` and its connection is not reused. (Retrying such
            # a request instead would also hide a server that resets requests it has read.)
            async with self._session.request(method, self._base + path, data=body, proxy=self._proxy,
                                             headers=_CLOSE if on_chunk is not None and self._close_streams
                                             else None) as resp:
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
        except aiohttp.ClientError as exc:
            raise self._transport_error(exc) from exc

    def _transport_error(self, exc: aiohttp.ClientError) -> TransportError:
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            return TransportError(records.CONNECT_ERROR, connect_reason(exc.certificate_error, self._hostport))
        if isinstance(exc, aiohttp.ClientConnectorError):
            return TransportError(records.CONNECT_ERROR, connect_reason(exc.os_error, self._hostport))
        return TransportError(records.DISCONNECTED, _reason(exc))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def tls_context(insecure: bool) -> ssl.SSLContext:
    """The TLS settings of every https target: the system's CAs, or no verification at all (--insecure)."""
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def connect_reason(exc: BaseException, hostport: str) -> str:
    """One line on why a connection could not be opened, with what to do when it is ours to say."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or _reason(exc)
        return (f"TLS certificate verification failed for {hostport} ({detail}); "
                "pass --insecure to skip certificate verification")
    if isinstance(exc, ssl.SSLError):
        advice = "; if it speaks plain HTTP, use an http:// URL" if exc.reason == "WRONG_VERSION_NUMBER" else ""
        return f"TLS handshake with {hostport} failed ({exc.reason or _reason(exc)}){advice}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host of {hostport} ({exc.strerror})"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {hostport} (is the server running?)"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot connect to {hostport} ({exc.strerror})"
    return f"cannot connect to {hostport} ({_reason(exc)})"


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
