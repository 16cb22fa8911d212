"""The two kinds of connection the fast transport's pool holds, one request at a time each.

- `SocketConnection` (plain TCP) reads its socket itself and takes the kernel's receive stamp
  (SO_TIMESTAMPNS) of every read: the time the bytes arrived, however long a busy loop took to
  read them.
- `StreamConnection` (TLS, through an asyncio transport and asyncio's `ssl`) stamps a read on the
  loop's clock in `data_received`, before parsing it.
Both feed their reads to a `ResponseParser` (http_parser.py) through what they share, `Connection`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import struct
import sys
import time
from typing import Protocol

from ..core import records
from ..core.clock import now_ns
from ..core.facilities import linux_facilities
from .http_parser import BadResponse, BodyTimedParser, ResponseParser
from .transport import ChunkCallback, HttpResponse, TransportError


class Owner(Protocol):
    """What a connection needs of the pool that holds it (pool.py's `ConnectionPool`), and all it
    tells it: each goes through these public names, so neither reaches into the other's state.

    loop            the running loop the connection's I/O is on
    kernel_stamps   time plain-TCP reads by the kernel's receive stamps when the socket allows
    read_buffer     one buffer every socket reads into, each read copied out before the next
    stall_ns        --stall-timeout in ns (0: off): only then are a body's reads timed
    """

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def kernel_stamps(self) -> bool: ...
    @property
    def read_buffer(self) -> memoryview: ...
    @property
    def stall_ns(self) -> int: ...

    def busy(self, conn: Connection) -> None:
        """`conn` carries a request now (its deadline is watched)."""

    def not_busy(self, conn: Connection) -> None:
        """`conn` carries no request any more."""

    def reusable(self, conn: Connection) -> None:
        """`conn` finished its request and may carry another."""

    def connection_closed(self, conn: Connection) -> None:
        """`conn` is closed (or was never opened): no longer counted."""

    def timed_on_loop(self) -> None:
        """A read was (or will be) timed on the loop's clock, not the kernel's."""


class Connection:
    """One connection carrying one request at a time: what both kinds of connection share.

    A subclass moves the bytes: `_write` sends a request, `_close_io` closes; it calls `_received`
    with each read and its arrival time, and `_lost` when the connection ends.
    """

    def __init__(self, pool: Owner) -> None:
        self._pool = pool
        self._loop = pool.loop
        # With --stall-timeout, a parser that notes its body's first byte, and reads timed after it;
        # without, neither costs a read anything.
        self._stall_watched = bool(pool.stall_ns)
        self.parser = BodyTimedParser() if self._stall_watched else ResponseParser()
        self.open = False  # counted in the pool: connected and not yet retired
        self.close_after = False  # the request asked for Connection: close
        self._waiter: asyncio.Future | None = None
        self.deadline = 0.0  # loop time by which the current request must be complete
        self._got_bytes = False
        # When the current request's last read arrived (clock.now_ns), once its body has begun; 0
        # before: the pool's watchdog calls a busy connection whose body began and then went quiet
        # `stalled`. Not the headers: llama-server sends them before the prefill of a request it
        # has begun, so a long prompt's first token comes seconds after them.
        self.last_read_ns = 0
        # How long opening this connection took (µs), and of that the TLS handshake: told with the
        # first response it carries (the request that paid for it), then None.
        self.connect_us: int | None = None
        self.tls_us: int | None = None

    def send(self, data: bytes, body: bytes | None, on_chunk: ChunkCallback | None, deadline: float,
             close_after: bool = False) -> asyncio.Future:
        self.parser.start(on_chunk)
        self._got_bytes = False
        self.last_read_ns = 0
        self.close_after = close_after
        waiter = self._waiter = self._loop.create_future()
        self.deadline = deadline
        self._pool.busy(self)
        self._write(data, body)
        return waiter

    def _received(self, data: bytes, t_ns: int) -> None:
        waiter = self._waiter
        if waiter is None:  # nothing was asked: the connection is out of step, drop it
            self.retire()
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
        if self._stall_watched and parser.body_ns:
            self.last_read_ns = t_ns
        if parser.complete:
            self._finish()

    def _lost(self, exc: BaseException | None) -> None:
        self._pool.connection_closed(self)
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
        self._pool.not_busy(self)
        # Not reusable after a server that answered before reading the whole body, among others.
        reusable = parser.keep_alive and not self.close_after and not parser.extra_data and self.open \
            and not self._unsent()
        response = HttpResponse(parser.status, parser.headers(), parser.headers_ns, parser.complete_ns,
                                b"" if parser._on_chunk is not None else parser.body(), self.connect_us, self.tls_us)
        self.connect_us = self.tls_us = None
        if reusable:
            self._pool.reusable(self)
        else:
            self.retire()
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: BaseException) -> None:
        waiter = self._waiter
        self._waiter = None
        self._pool.not_busy(self)
        self.retire()
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def timed_out(self) -> None:
        self._fail(TransportError(records.TIMEOUT, "no complete response within the timeout"))

    def stalled(self, stall_s: float) -> None:
        self._fail(TransportError(records.STALLED, f"HTTP {self.parser.status}: the body began, then nothing came "
                                                   f"for {stall_s:g} s (--stall-timeout)"))

    def abandon(self) -> None:
        """The caller gave up (cancelled): the connection's state is unknown, so close it."""
        self._waiter = None
        self._pool.not_busy(self)
        self.retire()

    def retire(self) -> None:
        """Close the connection and tell the pool."""
        self._close_io()
        self._pool.connection_closed(self)

    # the I/O, per kind of connection

    def _write(self, data: bytes, body: bytes | None) -> None:
        raise NotImplementedError

    def _unsent(self) -> bool:
        """Request bytes still waiting to be written."""
        raise NotImplementedError

    def _close_io(self) -> None:
        raise NotImplementedError


class StreamConnection(Connection, asyncio.Protocol):
    """A connection through an asyncio transport (TLS): reads are timed when the loop hands them over."""

    transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio hands a stream protocol a Transport
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


class SocketConnection(Connection):
    """A plain TCP connection read straight from its socket, each read timed by the kernel.

    With SO_TIMESTAMPNS the kernel stamps every received packet, and a read returns the stamp of
    the last packet in it: when the bytes arrived, not when a busy event loop got round to reading
    them. A client with hundreds of requests in flight handles their answers one after another,
    and a loop-clock stamp would add that wait to every latency; the kernel's does not. Without
    the option (not Linux) a read is stamped on the loop's clock, as `StreamConnection` does.
    """

    def __init__(self, pool: Owner, sock: socket.socket) -> None:
        super().__init__(pool)
        self.sock = sock
        self._fd = sock.fileno()
        self._pending: list[memoryview] = []  # request bytes the socket did not take yet
        if not (pool.kernel_stamps and enable_rx_stamps(sock)):
            pool.timed_on_loop()
        self._buffer = pool.read_buffer  # shared: each read is copied out before the next one
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
        self._received(buffer[:size].tobytes(), kernel_time(anc) if anc else now_ns())
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
SO_TIMESTAMPNS = 35
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
READ_SIZE = 64 * 1024  # one buffer per transport, reused by every read
_MAX_STAMP_AGE_NS = 60 * 1_000_000_000  # older than this: a clock step, not a packet; ignore it
_realtime_ns = functools.partial(time.clock_gettime_ns, time.CLOCK_REALTIME) if sys.platform == "linux" else None


# Reading sockets through loop.add_reader needs a selector-style loop (not Windows' proactor).
OWN_SOCKETS = sys.platform != "win32"


def enable_rx_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp every read of `sock` (Linux, unless LOADGEN_LINUX_FACILITIES=off);
    False when it does not: its reads are timed on the loop's clock."""
    if not linux_facilities():
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def kernel_time(anc: list[tuple[int, int, bytes]]) -> int:
    """A read's arrival on the monotonic clock: now less the age of the kernel's stamp.

    The stamp is on the wall clock (CLOCK_REALTIME), so its age is taken against the wall clock read
    at the same moment as the monotonic one (`clock_pair`); a stamp from the future or implausibly
    old is ignored (the read is then dated now).
    """
    mono, real = clock_pair()
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            sec, nsec = _TIMESPEC.unpack_from(data)
            age = real - (sec * 1_000_000_000 + nsec)
            if 0 <= age < _MAX_STAMP_AGE_NS:
                return mono - age
    return mono


def clock_pair() -> tuple[int, int]:
    """(monotonic, wall) clock readings of one moment: the wall clock read between two monotonic
    readings, again when the process was preempted in between (more than 20 µs apart), up to four
    times. Read one after the other with work between them, a preemption on a busy machine put the
    two readings milliseconds apart, and a response was dated before its request was sent."""
    for _ in range(4):
        before = now_ns()
        real = _realtime_ns()  # type: ignore[misc]  # None off Linux, where this function is never called
        after = now_ns()
        if after - before <= 20_000:
            break
    return (before + after) // 2, real


_TIMESPEC = struct.Struct("qq")
