"""The fast transport's connection pool: one keep-alive connection per in-flight request.

Idle connections are reused (last in, first out); one the server closed while idle is dropped, not
used. A request waits for a free connection while `max_connections` are open. Nothing is retried:
a request the server read and then dropped or reset is recorded as `disconnected`, since a retry
cannot tell that from the race with a closing keep-alive connection and would hide the fault.
Timeouts: one watchdog timer per pool checks the busy connections' deadlines.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from urllib.parse import SplitResult

from ..core import records
from ..core.clock import now_ns
from .connections import OWN_SOCKETS, READ_SIZE, Connection, SocketConnection, StreamConnection
from .transport import TransportError, connect_error, tls_context

# connect_ahead opens this many connections at once.
CONNECT_AHEAD_AT_ONCE = 32


class ConnectionPool:
    """A keep-alive pool of connections to one host: idle ones reused last in, first out, at most
    `_max` open, one watchdog timer for every busy connection's deadline. `_start` points it at
    its target on the running loop (`FastTransport.open` does)."""

    def __init__(self, kernel_stamps: bool = True) -> None:
        # Plain-TCP reads timed by the kernel's receive stamps (see `SocketConnection`); False
        # times them on the loop's clock when it reads them, as TLS connections always are.
        self.kernel_stamps = kernel_stamps
        self._loop_timed = not kernel_stamps  # some read was (or will be) timed on the loop's clock
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by _start, before any use
        self._idle: list[Connection] = []
        self._open = 0
        self._max = 1
        self._waiters: deque[asyncio.Future] = deque()
        self._timeout_s = 600.0
        self.stall_ns = 0  # --stall-timeout in ns; 0: off (connections time their body's reads only when on)
        self._closed = False
        # Timeouts: one watchdog timer per transport checks the busy connections' deadlines, which
        # costs far less than arming and cancelling a timer per request (~4 µs with uvloop).
        self._busy: set[Connection] = set()
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_every_s = 1.0

    def _start(self, parts: SplitResult, max_connections: int, timeout_s: float, insecure: bool,
               stall_s: float | None = None) -> None:
        """Point the pool at the target `parts` (an http or https URL) on the running loop."""
        self._loop = asyncio.get_running_loop()
        self._host = parts.hostname or ""  # a base URL is parsed with its host at the edge (core.baseurl)
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._hostport = parts.netloc
        self._ssl = tls_context(insecure) if parts.scheme == "https" else None
        if self._ssl is not None or not OWN_SOCKETS:
            self._loop_timed = True
        self._addrs: list[tuple[int, tuple]] = []  # resolved once (plain TCP), the working one first
        self._resolving: asyncio.Future | None = None
        self._read_buffer = memoryview(bytearray(READ_SIZE))  # every socket's reads, copied out at once
        self._max = max_connections if max_connections > 0 else 1 << 30  # 0: no limit (open loop)
        self._timeout_s = timeout_s
        self.stall_ns = round(stall_s * 1e9) if stall_s else 0
        # A timeout (or a stall) fires at most 5% late.
        self._watch_every_s = min(1.0, max(0.005, min(timeout_s, stall_s or timeout_s) / 20))
        self._watchdog = self._loop.call_later(self._watch_every_s, self._watch)

    @property
    def read_clock(self) -> str:
        """"kernel" while every connection so far times its reads by the kernel's stamps."""
        return "loop" if self._loop_timed else "kernel"

    async def _acquire(self, deadline: float) -> Connection:
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

    async def connect_ahead(self, connections: int) -> int:
        """Open idle connections until `connections` are open (at most the pool's limit), at most
        `CONNECT_AHEAD_AT_ONCE` at a time (a server with a short listen backlog drops a burst of
        SYNs, and each dropped one waits a second to be sent again). Returns how many are open.
        A connect that fails is dropped silently: the level's requests will meet and record it."""
        deadline = self._loop.time() + self._timeout_s
        while not self._closed and self._open < min(connections, self._max):
            batch = min(connections, self._max) - self._open
            made = await asyncio.gather(*(self._connect(deadline) for _ in range(min(batch, CONNECT_AHEAD_AT_ONCE))),
                                        return_exceptions=True)
            opened = [conn for conn in made if isinstance(conn, Connection)]
            for conn in opened:
                conn.connect_us = conn.tls_us = None  # opened before any request's clock started
                self.reusable(conn)
            for exc in made:
                if isinstance(exc, BaseException) and not isinstance(exc, TransportError):
                    raise exc
            if len(opened) < len(made):
                break
        return self._open

    async def _connect(self, deadline: float) -> Connection:
        if self._closed:
            raise TransportError(records.CONNECT_ERROR, "the transport is closed")
        self._open += 1  # counted from now, so concurrent connects respect the limit
        made: list[StreamConnection] = []
        start = now_ns()

        def protocol() -> StreamConnection:
            made.append(StreamConnection(self))
            return made[0]

        try:
            async with asyncio.timeout_at(deadline):
                if self._ssl is None and OWN_SOCKETS:
                    conn: Connection = await self._connect_socket()
                else:
                    conn = await self._connect_stream(protocol, made)
        except BaseException as exc:
            if made and made[0].open:  # connected, then failed (TLS) or cancelled: retire it
                made[0].retire()
            else:
                self._open -= 1
                self._wake()
            if isinstance(exc, TimeoutError):
                raise TransportError(records.CONNECT_ERROR,
                                     f"could not connect to {self._hostport} within the timeout") from None
            if isinstance(exc, (OSError, ssl.SSLError)):
                raise connect_error(exc, self._hostport) from None
            raise
        conn.connect_us = (now_ns() - start) // 1000
        return conn

    async def _connect_stream(self, protocol, made: list[StreamConnection]) -> StreamConnection:
        """A connection through an asyncio transport: TCP, then the TLS handshake on it (https), so
        the handshake's share of connecting is known."""
        transport, conn = await self._loop.create_connection(protocol, self._host, self._port)
        if self._ssl is not None:
            start = now_ns()
            conn.transport = await self._loop.start_tls(transport, conn, self._ssl, server_hostname=self._host)
            conn.tls_us = (now_ns() - start) // 1000
        return conn

    async def _connect_socket(self) -> SocketConnection:
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
            return SocketConnection(self, sock)
        raise error or OSError(f"no address for {self._host}")

    def _watch(self) -> None:
        now = self._loop.time()
        for conn in [c for c in self._busy if c.deadline <= now]:
            conn.timed_out()
        if self.stall_ns:
            since = now_ns() - self.stall_ns  # a busy connection's last read before this: stalled
            for conn in [c for c in self._busy if 0 < c.last_read_ns < since]:
                conn.stalled(self.stall_ns / 1e9)
        self._watchdog = self._loop.call_later(self._watch_every_s, self._watch)

    # What its connections tell it (connections.py's `Owner`).

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def read_buffer(self) -> memoryview:
        return self._read_buffer

    def busy(self, conn: Connection) -> None:
        self._busy.add(conn)

    def not_busy(self, conn: Connection) -> None:
        self._busy.discard(conn)

    def timed_on_loop(self) -> None:
        self._loop_timed = True

    def reusable(self, conn: Connection) -> None:
        if self._closed:
            conn.retire()
            return
        self._idle.append(conn)
        self._wake()

    def connection_closed(self, conn: Connection) -> None:
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
            conn.retire()
        self._idle.clear()
