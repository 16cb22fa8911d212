"""The fast transport: plain sockets (asyncio Protocols for TLS) and httptools, tens of µs per request.

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
  only Content-Length and the body are written, in one `send`.
- Every read carries its arrival time. Plain TCP (`_SocketConnection`) reads the socket itself and
  takes the kernel's receive stamp (SO_TIMESTAMPNS): the time the bytes arrived, however long a
  busy loop took to read them. TLS (`_Connection`, asyncio's `ssl`) stamps a read on the loop's
  clock in `data_received`, before parsing it.
- Responses are parsed incrementally by `ResponseParser` (Content-Length, chunked, read-until-close,
  1xx skipped). A read's de-chunked body bytes go to `on_chunk` in one call, so no whole body is
  buffered when streaming.
- No proxies, no HTTP/2, no HEAD: `make_transport` falls back to aiohttp when the environment sets
  a proxy for the target.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import os
import socket
import ssl
import struct
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from .core import records
from .core.clock import now_ns
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

    Header fields are not handed to Python one by one (loadgen reads none of them on the hot path):
    the reads up to the end of the head are kept, and `headers()` parses them when asked.
    """

    __slots__ = ("_parser", "_on_chunk", "_pieces", "_head_reads", "_t_ns", "status", "headers_ns",
                 "complete", "complete_ns", "keep_alive", "extra_data")

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.start(None)

    def start(self, on_chunk: ChunkCallback | None) -> None:
        self._on_chunk = on_chunk
        self._pieces: list[bytes] = []
        self._head_reads: list[bytes] = []
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
        if not self.status:
            self._head_reads.append(data)
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
        names = {n.lower() for n, _ in _head_fields(self._head_reads)}
        return b"content-length" in names or b"transfer-encoding" in names

    def body(self) -> bytes:
        p = self._pieces
        return b"" if not p else p[0] if len(p) == 1 else b"".join(p)

    def headers(self) -> "ResponseHeaders":
        return ResponseHeaders(self._head_reads if self.status else [])

    # httptools callbacks (no on_header: see the class docstring) ---------------------------------

    def on_headers_complete(self) -> None:
        if self.complete:  # a second response after ours: the server is out of step
            self.extra_data = True
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # 100 Continue, 103 Early Hints: a final response follows
            return
        self.status, self.headers_ns = status, self._t_ns

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self.status and not self.complete:
            self.complete, self.complete_ns = True, self._t_ns
            self.keep_alive = self._parser.should_keep_alive()


def _head_fields(reads: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The header fields of the final (non-1xx) response head at the start of `reads`, which
    httptools has already found valid: interim 1xx heads before it are skipped."""
    data = b"".join(reads)
    start = len(data) - len(data.lstrip(b"\r\n"))  # empty lines before a status line are allowed
    while True:
        end = data.find(b"\r\n\r\n", start)
        if end < 0:
            return []
        lines = data[start:end].split(b"\r\n")
        status = lines[0].split(None, 2)[1:2]
        if not (status and status[0][:1] == b"1" and len(status[0]) == 3):
            break
        start = end + 4
        start += len(data) - start - len(data[start:].lstrip(b"\r\n"))
    fields = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields.append((name, value.strip(b" \t")))
    return fields


class ResponseHeaders(Mapping[str, str]):
    """A response's headers, names case-insensitive; parsed only when first read (most never are)."""

    __slots__ = ("_reads", "_decoded")

    def __init__(self, reads: list[bytes]):
        self._reads = reads
        self._decoded: CIMultiDictProxy[str] | None = None

    def _headers(self) -> CIMultiDictProxy[str]:
        if self._decoded is None:
            self._decoded = CIMultiDictProxy(CIMultiDict(
                (n.decode("latin-1"), v.decode("latin-1")) for n, v in _head_fields(self._reads)))
        return self._decoded

    def __getitem__(self, name: str) -> str:
        return self._headers()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers())

    def __len__(self) -> int:
        return len(self._headers())

    def items(self):  # every (name, value), repeated names included, in the order received
        return self._headers().items()

    def getall(self, name: str) -> list[str]:
        return self._headers().getall(name)

    def __repr__(self) -> str:
        return f"ResponseHeaders({dict(self._headers().items())!r})"


class _Exchange:
    """One connection carrying one request at a time: what both kinds of connection share.

    A subclass moves the bytes: `_write` sends a request, `_close_io` closes; it calls `_received`
    with each read and its arrival time, and `_lost` when the connection ends.
    """

    def __init__(self, pool: "FastTransport") -> None:
        self._pool = pool
        self._loop = pool._loop
        self.parser = ResponseParser()
        self.open = False  # counted in the pool: connected and not yet retired
        self.close_after = False  # the request asked for Connection: close
        self._waiter: asyncio.Future | None = None
        self.deadline = 0.0  # loop time by which the current request must be complete
        self._got_bytes = False

    def send(self, data: bytes, body: bytes | None, on_chunk: ChunkCallback | None, deadline: float,
             close_after: bool = False) -> asyncio.Future:
        self.parser.start(on_chunk)
        self._got_bytes = False
        self.close_after = close_after
        waiter = self._waiter = self._loop.create_future()
        self.deadline = deadline
        self._pool._busy.add(self)
        self._write(data, body)
        return waiter

    def _received(self, data: bytes, t_ns: int) -> None:
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

    def _lost(self, exc: BaseException | None) -> None:
        self._pool._connection_closed(self)
        if self._waiter is None:
            return
        if exc is None and self.parser.feed_eof(now_ns()):  # a reset never ends a body cleanly
            self._finish()
        else:
            what = "reset the connection" if isinstance(exc, ConnectionResetError) else "closed the connection"
            when = "mid-body" if self.parser.status else "before the response" if not self._got_bytes \
                else "mid-headers"
            self._fail(TransportError(records.DISCONNECTED, f"the server {what} {when}"))

    def _finish(self) -> None:
        parser, waiter = self.parser, self._waiter
        self._waiter = None
        self._pool._busy.discard(self)
        # Not reusable after a server that answered before reading the whole body, among others.
        reusable = parser.keep_alive and not self.close_after and not parser.extra_data and self.open \
            and not self._unsent()
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
        self._close_io()
        self._pool._connection_closed(self)

    # the I/O, per kind of connection

    def _write(self, data: bytes, body: bytes | None) -> None:
        raise NotImplementedError

    def _unsent(self) -> bool:
        """Request bytes still waiting to be written."""
        raise NotImplementedError

    def _close_io(self) -> None:
        raise NotImplementedError


class _Connection(_Exchange, asyncio.Protocol):
    """A connection through an asyncio transport (TLS): reads are timed when the loop hands them over."""

    transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def data_received(self, data: bytes) -> None:
        self._received(data, now_ns())  # before parsing: a read's time is when it arrived

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)

    def _write(self, data: bytes, body: bytes | None) -> None:
        transport = self.transport
        assert transport is not None
        if body is None:
            transport.write(data)
        else:
            transport.writelines((data, body))

    def _unsent(self) -> bool:
        return self.transport is None or self.transport.get_write_buffer_size() > 0

    def _close_io(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _SocketConnection(_Exchange):
    """A plain TCP connection read straight from its socket, each read timed by the kernel.

    With SO_TIMESTAMPNS the kernel stamps every received packet, and a read returns the stamp of
    the last packet in it: when the bytes arrived, not when a busy event loop got round to reading
    them. A client with hundreds of requests in flight handles their answers one after another,
    and a loop-clock stamp would add that wait to every latency; the kernel's does not. Without
    the option (not Linux) a read is stamped on the loop's clock, as `_Connection` does.
    """

    def __init__(self, pool: "FastTransport", sock: socket.socket) -> None:
        super().__init__(pool)
        self.sock = sock
        self._fd = sock.fileno()
        self._pending: list[memoryview] = []  # request bytes the socket did not take yet
        if not (pool.kernel_stamps and _enable_rx_stamps(sock)):
            pool._loop_timed = True
        self._buffer = pool._read_buffer  # shared: each read is copied out before the next one
        self._loop.add_reader(self._fd, self._readable)
        self.open = True

    def _readable(self) -> None:
        buffer = self._buffer
        try:
            size, anc, _, _ = self.sock.recvmsg_into((buffer,), _ANC_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._broken(exc)
            return
        if not size:  # the server closed its side: close ours too
            self._broken(None)
            return
        t_ns = now_ns()
        if anc:
            t_ns = _kernel_time(anc, t_ns)
        self._received(buffer[:size].tobytes(), t_ns)
        # A reset that came in with these bytes: uvloop (libuv) runs this callback once for it and
        # then stops watching the socket, so the error must be picked up now or never.
        if self._fd >= 0:
            error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if error:
                self._broken(OSError(error, os.strerror(error)))  # ECONNRESET: a ConnectionResetError

    def _write(self, data: bytes, body: bytes | None) -> None:
        pending = self._pending
        if pending:  # cannot happen: one request at a time, and a conn with unsent bytes is not reused
            raise RuntimeError("a request was sent on a connection still writing the previous one")
        try:
            sent = self.sock.send(data) if body is None else self.sock.sendmsg((data, body))
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._broken(exc)
            return
        size = len(data) + (0 if body is None else len(body))
        if sent < size:
            self._queue(sent, data, body)

    def _queue(self, sent: int, data: bytes, body: bytes | None) -> None:
        for part in (data, body):
            if part is None:
                continue
            if sent >= len(part):
                sent -= len(part)
                continue
            self._pending.append(memoryview(part)[sent:])
            sent = 0
        self._loop.add_writer(self._fd, self._writable)

    def _writable(self) -> None:
        pending = self._pending
        try:
            sent = self.sock.sendmsg(pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._broken(exc)
            return
        while pending and sent >= len(pending[0]):
            sent -= len(pending.pop(0))
        if pending:
            pending[0] = pending[0][sent:]
        else:
            self._loop.remove_writer(self._fd)

    def _unsent(self) -> bool:
        return bool(self._pending)

    def _broken(self, exc: BaseException | None) -> None:
        """The socket failed or reached its end: close it, then settle the request in flight."""
        self._close_io()
        self._lost(exc)

    def _close_io(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            if self._pending:
                self._loop.remove_writer(self._fd)
                self._pending.clear()
            self._fd = -1
            self.sock.close()


# Linux: SO_TIMESTAMPNS (35; Python's socket module does not name it) and its control message,
# a struct timespec (two 64-bit fields) of CLOCK_REALTIME.
_SO_TIMESTAMPNS = 35
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
_READ_SIZE = 64 * 1024  # one buffer per transport, reused by every read
_MAX_STAMP_AGE_NS = 60 * 1_000_000_000  # older than this: a clock step, not a packet; ignore it
_realtime_ns = functools.partial(time.clock_gettime_ns, time.CLOCK_REALTIME) if sys.platform == "linux" else None


# Reading sockets through loop.add_reader needs a selector-style loop (not Windows' proactor).
_OWN_SOCKETS = sys.platform != "win32"


def _enable_rx_stamps(sock: socket.socket) -> bool:
    if sys.platform != "linux":
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def _kernel_time(anc: list[tuple[int, int, bytes]], now: int) -> int:
    """A read's arrival on the monotonic clock: `now` less the age of the kernel's stamp.

    The stamp is on the wall clock (CLOCK_REALTIME), so its age is taken against the wall clock
    read at the same moment as `now`; a stamp from the future or implausibly old is ignored.
    """
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            age = _realtime_ns() - (sec * 1_000_000_000 + nsec)
            if 0 <= age < _MAX_STAMP_AGE_NS:
                return now - age
    return now


_TIMESPEC = struct.Struct("qq")


class FastTransport:
    """A keep-alive pool of `_Connection`s to one base URL. See the module docstring."""

    def __init__(self, kernel_stamps: bool = True) -> None:
        # Plain-TCP reads timed by the kernel's receive stamps (see `_SocketConnection`); False
        # times them on the loop's clock when it reads them, as TLS connections always are.
        self.kernel_stamps = kernel_stamps
        self._loop_timed = not kernel_stamps  # some read was (or will be) timed on the loop's clock
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._idle: list[_Exchange] = []
        self._open = 0
        self._max = 1
        self._waiters: deque[asyncio.Future] = deque()
        self._heads: dict[tuple[str, str, bool], bytes] = {}
        self._timeout_s = 600.0
        self._closed = False
        # Timeouts: one watchdog timer per transport checks the busy connections' deadlines, which
        # costs far less than arming and cancelling a timer per request (~4 µs with uvloop).
        self._busy: set[_Exchange] = set()
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
        if self._ssl is not None or not _OWN_SOCKETS:
            self._loop_timed = True
        self._addrs: list[tuple[int, tuple]] = []  # resolved once (plain TCP), the working one first
        self._resolving: asyncio.Future | None = None
        self._read_buffer = memoryview(bytearray(_READ_SIZE))  # every socket's reads, copied out at once
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

    @property
    def read_clock(self) -> str:
        """"kernel" while every connection so far times its reads by the kernel's stamps."""
        return "loop" if self._loop_timed else "kernel"

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

    async def _acquire(self, deadline: float) -> _Exchange:
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

    async def _connect(self, deadline: float) -> _Exchange:
        if self._closed:
            raise TransportError(records.CONNECT_ERROR, "the transport is closed")
        self._open += 1  # counted from now, so concurrent connects respect the limit
        made: list[_Connection] = []

        def protocol() -> _Connection:
            made.append(_Connection(self))
            return made[0]

        try:
            async with asyncio.timeout_at(deadline):
                if self._ssl is None and _OWN_SOCKETS:
                    return await self._connect_socket()
                _, conn = await self._loop.create_connection(
                    protocol, self._host, self._port, ssl=self._ssl, server_hostname=self._host)
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

    async def _connect_socket(self) -> _SocketConnection:
        """A plain TCP connection to the first of the target's addresses that takes it."""
        if not self._addrs:
            if self._resolving is None:  # one lookup, shared by the connects that wait for it
                self._resolving = asyncio.ensure_future(
                    self._loop.getaddrinfo(self._host, self._port, type=socket.SOCK_STREAM))
            try:
                infos = await asyncio.shield(self._resolving)
            except OSError:
                self._resolving = None  # a failed lookup is tried again by the next connect
                raise
            self._addrs = self._addrs or [(family, addr) for family, _, _, _, addr in infos]
        error: OSError | None = None
        for family, addr in tuple(self._addrs):  # a snapshot: other connects reorder the list
            sock = None
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await self._loop.sock_connect(sock, addr)
            except OSError as exc:
                if sock is not None:
                    sock.close()
                error = error or exc  # the first address's reason is the one to tell
                continue
            except BaseException:
                if sock is not None:
                    sock.close()
                raise
            if self._addrs[0] != (family, addr):  # start with the address that works next time
                self._addrs = [(family, addr), *(a for a in self._addrs if a != (family, addr))]
            return _SocketConnection(self, sock)
        raise error or OSError(f"no address for {self._host}")

    def _watch(self) -> None:
        now = self._loop.time()
        for conn in [c for c in self._busy if c.deadline <= now]:
            conn.timed_out()
        self._watchdog = self._loop.call_later(self._watch_every_s, self._watch)

    def _release(self, conn: _Exchange) -> None:
        if self._closed:
            conn._retire()
            return
        self._idle.append(conn)
        self._wake()

    def _connection_closed(self, conn: _Exchange) -> None:
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
