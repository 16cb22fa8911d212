"""The fast transport: asyncio Protocols and httptools, so the client costs tens of µs per request.

aiohttp spends 250-300 µs of CPU per request; this transport spends a fifth of that, so one client
core can keep 64 requests in flight against a fast server and measure it rather than itself.

- One HTTP/1.1 keep-alive connection per in-flight request, per target; idle ones are reused
  (last in, first out); one the server closed while idle is dropped, not used. Nothing is retried:
  a request the server read and then dropped or reset is recorded as `disconnected`, since a retry
  cannot tell that from the race with a closing keep-alive connection and would hide the fault.
  With `close_streams` (llama-server targets) streamed requests ask for `Connection: close`:
  llama-server closes the connection after every stream although it announces keep-alive, so a
  reused one would die under the next request.
- The request head (method, path, Host, headers) is serialised once per (method, path); per request
  only Content-Length and the body are written, in one `write`.
- Responses are parsed incrementally by `ResponseParser` (Content-Length, chunked, read-until-close,
  1xx skipped). Each network read is timestamped in `data_received`, before it is parsed, and its
  de-chunked body bytes go to `on_chunk` in one call, so no whole body is buffered when streaming.
- `https://` goes through asyncio's `ssl`. No proxies, no HTTP/2, no HEAD: `make_transport` falls
  back to aiohttp when the environment sets a proxy for the target.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from . import records
from .clock import now_ns
from .transport import (AiohttpTransport, ChunkCallback, HttpResponse, Transport, TransportError, connect_reason,
                        tls_context)

TRANSPORT_NAMES = ("fast", "aiohttp")

# Bodies up to this size are copied behind the head so a request is one write (one syscall).
_ONE_WRITE_MAX = 256 * 1024


class BadResponse(Exception):
    """Bytes that are not a valid HTTP/1.x response."""


class ResponseParser:
    """One connection's incremental response parsing: feed it reads, it says when a response is done.

    After `start(on_chunk)`, `feed(data, t_ns)` any split of a response's bytes; `complete` turns
    True on the read that ends it. Body bytes go to `on_chunk(bytes, t_ns)` once per read (de-chunked)
    or, without `on_chunk`, are kept for `body()`. Interim 1xx responses are skipped.
    """

    __slots__ = ("_parser", "_on_chunk", "_pieces", "_raw_headers", "_t_ns", "status", "headers_ns",
                 "complete", "complete_ns", "keep_alive", "extra_data")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.start(None)

    def start(self, on_chunk: ChunkCallback | None) -> None:
        self._on_chunk = on_chunk
        self._pieces: list[bytes] = []
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._t_ns = 0
        self.status = 0  # 0 until the final (non-1xx) status line and headers are in
        self.headers_ns = 0
        self.complete = False
        self.complete_ns = 0
        self.keep_alive = False
        self.extra_data = False  # bytes after the response: the connection cannot be reused

    def feed(self, data: bytes, t_ns: int) -> None:
        """Parse one read. Raises BadResponse; exceptions from `on_chunk` propagate."""
        self._t_ns = t_ns
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if not self.complete:
                raise BadResponse("the server switched protocols (HTTP upgrade)") from None
            self.extra_data = True
        except httptools.HttpParserError as exc:
            if not self.complete:
                raise BadResponse(f"invalid HTTP response ({_first_line(exc)})") from None
            self.extra_data = True  # e.g. bytes after a `Connection: close` response
        if self._on_chunk is not None and self._pieces:
            pieces, self._pieces = self._pieces, []
            self._on_chunk(pieces[0] if len(pieces) == 1 else b"".join(pieces), t_ns)

    def feed_eof(self, t_ns: int) -> bool:
        """The server closed its side. True when that ended a response delimited by the close."""
        if self.complete or not self.status or self._has_length():
            return False
        self.complete, self.complete_ns, self.keep_alive = True, t_ns, False
        return True

    def _has_length(self) -> bool:
        if self.status in (204, 304):
            return True
        names = {n.lower() for n, _ in self._raw_headers}
        return b"content-length" in names or b"transfer-encoding" in names

    def body(self) -> bytes:
        p = self._pieces
        return b"" if not p else p[0] if len(p) == 1 else b"".join(p)

    def headers(self) -> "ResponseHeaders":
        return ResponseHeaders(self._raw_headers)

    # httptools callbacks -------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:  # a second response after ours: the server is out of step
            self.extra_data = True
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: a final response follows
            self._raw_headers = []
            return
        self.status, self.headers_ns = status, self._t_ns

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self.status and not self.complete:
            self.complete, self.complete_ns = True, self._t_ns
            self.keep_alive = self._parser.should_keep_alive()


class ResponseHeaders(Mapping[str, str]):
    """A response's headers, names case-insensitive; decoded only when first read (most never are)."""

    __slots__ = ("_raw", "_decoded")

    def __init__(self, raw: list[tuple[bytes, bytes]]):
        self._raw = raw
        self._decoded: CIMultiDictProxy[str] | None = None

    def _headers(self) -> CIMultiDictProxy[str]:
        if self._decoded is None:
            self._decoded = CIMultiDictProxy(CIMultiDict(
                (n.decode("latin-1"), v.decode("latin-1")) for n, v in self._raw))
        return self._decoded

    def __getitem__(self, name: str) -> str:
        return self._headers()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers())

    def __len__(self) -> int:
        return len(self._raw)

    def items(self):  # every (name, value), repeated names included, in the order received
        return self._headers().items()

    def getall(self, name: str) -> list[str]:
        return self._headers().getall(name)

    def __repr__(self) -> str:
        return f"ResponseHeaders({dict(self._headers().items())!r})"


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection; carries one request at a time."""

    def __init__(self, pool: "FastTransport") -> None:
        self._pool = pool
        self._loop = pool._loop
        self.transport: asyncio.Transport | None = None
        self.parser = ResponseParser()
        self.open = False  # counted in the pool: connected and not yet retired
        self.close_after = False  # the request asked for Connection: close
        self._waiter: asyncio.Future | None = None
        self.deadline = 0.0  # loop time by which the current request must be complete
        self._got_bytes = False

    # asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        t_ns = now_ns()  # before parsing: a read's time is when it arrived, not when it was handled
        waiter = self._waiter
        if waiter is None:  # nothing was asked: the connection is out of step, drop it
            self._retire()
            return
        self._got_bytes = True
        parser = self.parser
        try:
            parser.feed(data, t_ns)
        except BadResponse as exc:
            self._fail(TransportError(records.DISCONNECTED, str(exc)))
            return
        except BaseException as exc:  # raised by on_chunk: the caller's to see
            self._fail(exc)
            return
        if parser.complete:
            self._finish()

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._pool._connection_closed(self)
        if self._waiter is None:
            return
        if self.parser.feed_eof(now_ns()):
            self._finish()
        else:
            what = "reset the connection" if isinstance(exc, ConnectionResetError) else "closed the connection"
            when = "mid-body" if self.parser.status else "before the response" if not self._got_bytes \
                else "mid-headers"
            self._fail(TransportError(records.DISCONNECTED, f"the server {what} {when}"))

    # the request

    def send(self, data: bytes, body: bytes | None, on_chunk: ChunkCallback | None, deadline: float,
             close_after: bool = False) -> asyncio.Future:
        self.parser.start(on_chunk)
        self._got_bytes = False
        self.close_after = close_after
        waiter = self._waiter = self._loop.create_future()
        self.deadline = deadline
        self._pool._busy.add(self)
        transport = self.transport
        assert transport is not None
        if body is None:
            transport.write(data)
        else:
            transport.writelines((data, body))
        return waiter

    def _finish(self) -> None:
        parser, waiter = self.parser, self._waiter
        self._waiter = None
        self._pool._busy.discard(self)
        transport = self.transport
        reusable = parser.keep_alive and not self.close_after and not parser.extra_data and self.open \
            and transport is not None \
            and transport.get_write_buffer_size() == 0  # a server that answered before reading the whole body
        response = HttpResponse(parser.status, parser.headers(), parser.headers_ns, parser.complete_ns,
                                b"" if parser._on_chunk is not None else parser.body())
        if reusable:
            self._pool._release(self)
        else:
            self._retire()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        self._waiter = None
        self._pool._busy.discard(self)
        self._retire()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def timed_out(self) -> None:
        self._fail(TransportError(records.TIMEOUT, "no complete response within the timeout"))

    def abandon(self) -> None:
        """The caller gave up (cancelled): the connection's state is unknown, so close it."""
        self._waiter = None
        self._pool._busy.discard(self)
        self._retire()

    def _retire(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._pool._connection_closed(self)


class FastTransport:
    """A keep-alive pool of `_Connection`s to one base URL. See the module docstring."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._idle: list[_Connection] = []
        self._open = 0
        self._max = 1
        self._waiters: deque[asyncio.Future] = deque()
        self._heads: dict[tuple[str, str, bool], bytes] = {}
        self._timeout_s = 600.0
        self._closed = False
        # Timeouts: one watchdog timer per transport checks the busy connections' deadlines, which
        # costs far less than arming and cancelling a timer per request (~4 µs with uvloop).
        self._busy: set[_Connection] = set()
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_every_s = 1.0

    async def open(self, base_url: str, max_connections: int, timeout_s: float,
                   headers: Mapping[str, str] | None = None, insecure: bool = False,
                   close_streams: bool = True) -> None:
        self._close_streams = close_streams
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) base URL: {base_url!r}")
        self._loop = asyncio.get_running_loop()
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._hostport = parts.netloc
        self._ssl = tls_context(insecure) if parts.scheme == "https" else None
        self._max = max_connections if max_connections > 0 else 1 << 30  # 0: no limit (open loop)
        self._timeout_s = timeout_s
        self._watch_every_s = min(1.0, max(0.005, timeout_s / 20))  # a timeout fires at most 5% late
        self._watchdog = self._loop.call_later(self._watch_every_s, self._watch)
        fields = {"Host": parts.netloc, "Content-Type": "application/json"}
        for name, value in (headers or {}).items():
            for existing in [k for k in fields if k.lower() == name.lower()]:
                del fields[existing]
            fields[name] = value
        self._header_lines = "".join(f"{k}: {v}\r\n" for k, v in fields.items())

    def _head(self, method: str, path: str, close: bool) -> bytes:
        connection = "Connection: close\r\n" if close else ""
        head = f"{method} {path} HTTP/1.1\r\n{self._header_lines}{connection}Content-Length: ".encode("latin-1")
        self._heads[(method, path, close)] = head
        return head

    async def request(self, method: str, path: str, body: bytes,
                      on_chunk: ChunkCallback | None = None) -> HttpResponse:
        if method == "HEAD":
            raise ValueError("the fast transport does not send HEAD requests; use the aiohttp transport")
        close = on_chunk is not None and self._close_streams
        head = self._heads.get((method, path, close)) or self._head(method, path, close)
        head += b"%d\r\n\r\n" % len(body)
        if len(body) <= _ONE_WRITE_MAX:
            data, rest = head + body, None
        else:
            data, rest = head, body
        deadline = self._loop.time() + self._timeout_s
        idle = self._idle
        conn = idle.pop() if idle else None
        if conn is None or not conn.open:  # the fast path above skips a coroutine per request
            conn = await self._acquire(deadline)
        waiter = conn.send(data, rest, on_chunk, deadline, close)
        try:
            return await waiter
        except asyncio.CancelledError:
            conn.abandon()
            raise

    async def _acquire(self, deadline: float) -> _Connection:
        idle = self._idle
        while idle:
            conn = idle.pop()
            if conn.open:
                return conn
        while self._open >= self._max:
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                raise TransportError(records.TIMEOUT, "no free connection within the timeout") from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
            while idle:
                conn = idle.pop()
                if conn.open:
                    return conn
        return await self._connect(deadline)

    async def _connect(self, deadline: float) -> _Connection:
        if self._closed:
            raise TransportError(records.CONNECT_ERROR, "the transport is closed")
        self._open += 1  # counted from now, so concurrent connects respect the limit
        made: list[_Connection] = []

        def protocol() -> _Connection:
            made.append(_Connection(self))
            return made[0]

        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await self._loop.create_connection(
                    protocol, self._host, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None)
        except BaseException as exc:
            if made and made[0].open:  # connected, then failed (TLS) or cancelled: retire it
                made[0]._retire()
            else:
                self._open -= 1
                self._wake()
            if isinstance(exc, TimeoutError):
                raise TransportError(records.CONNECT_ERROR,
                                     f"could not connect to {self._hostport} within the timeout") from None
            if isinstance(exc, (OSError, ssl.SSLError)):
                raise TransportError(records.CONNECT_ERROR, connect_reason(exc, self._hostport)) from None
            raise
        return conn

    def _watch(self) -> None:
        now = self._loop.time()
        for conn in [c for c in self._busy if c.deadline <= now]:
            conn.timed_out()
        self._watchdog = self._loop.call_later(self._watch_every_s, self._watch)

    def _release(self, conn: _Connection) -> None:
        if self._closed:
            conn._retire()
            return
        self._idle.append(conn)
        self._wake()

    def _connection_closed(self, conn: _Connection) -> None:
        if conn.open:
            conn.open = False
            self._open -= 1
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        for conn in self._idle:
            conn._retire()
        self._idle.clear()


def environment_proxy(url: str) -> str | None:
    """The proxy the environment (http_proxy, https_proxy, all_proxy, no_proxy) sets for `url`.

    Loopback targets are never proxied, whatever the environment says.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass_environment(host, proxies):
        return None
    return proxy


def make_transport(name: str, url: str, say: Callable[[str], None] | None = None) -> Transport:
    """The transport called `name` for `url`; the fast one falls back to aiohttp behind a proxy."""
    proxy = environment_proxy(url)
    if name == "aiohttp":
        return AiohttpTransport(proxy=proxy)
    if name != "fast":
        raise ValueError(f"unknown transport {name!r}")
    if proxy is not None:
        if say is not None:
            say(f"{urlsplit(url).netloc}: using the aiohttp transport, because the environment sets a proxy "
                f"for it ({_without_credentials(proxy)}) and the fast transport does not speak to proxies")
        return AiohttpTransport(proxy=proxy)
    return FastTransport()


def _without_credentials(proxy: str) -> str:
    parts = urlsplit(proxy)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if parts.netloc else proxy


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
