"""A fixed pool of HTTP threads in front of the simulated server, as llama-server's HTTP library serves
connections: a connection takes a thread for as long as it is kept alive, and gives it back once it
has been idle for the keep-alive timeout (5 s in llama-server) or is closed. A request on a
connection that has no thread waits for one, before the server (its slots, its deferred queue, its
/metrics) knows anything of it: the wait a scrape of /metrics or /slots cannot see.

llama-server's pool is `--threads-http` threads (by default max(n_parallel + 2, cores − 1) in the
builds the field reports ran; newer ones add threads on demand, which leaves a race at bursts of
new connections). The simulator's `--threads-http N` gives the fixed pool, so a test can make the
starvation happen on purpose; without it there is no limit.

A connection takes its thread with its first request (the real server's takes it when the
connection is accepted; loadgen opens a level's connections and sends on each at once, so the two
differ by a connect's time).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# How often an idle connection that holds a thread is looked at for a close by its client.
CLOSED_POLL_S = 0.02


class HttpThreads:
    """`threads` HTTP threads shared by every connection (see the module)."""

    def __init__(self, threads: int, keep_alive_s: float = 5.0):
        if threads < 1:
            raise ValueError("threads_http must be at least 1")
        self.threads = threads
        self.keep_alive_s = keep_alive_s
        self._free = threads
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._held: dict[object, asyncio.Task[None] | None] = {}  # connection -> its idle watch, if idle

    @property
    def busy(self) -> int:
        return self.threads - self._free

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        conn = request.transport
        if conn is None:
            return await handler(request)
        await self._take(conn)
        try:
            return await handler(request)
        finally:
            if request.keep_alive and not conn.is_closing():
                self._held[conn] = asyncio.ensure_future(self._idle(conn))
            else:
                self._give_back(conn)

    async def _take(self, conn: object) -> None:
        if conn in self._held:  # this connection's thread: stop counting its idle time
            watch = self._held[conn]
            if watch is not None:
                watch.cancel()
            self._held[conn] = None
            return
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():  # handed a thread just as it gave up
                    self._hand_on()
                else:
                    self._waiting.remove(turn)
                raise
        self._held[conn] = None

    async def _idle(self, conn: asyncio.BaseTransport) -> None:
        """Keep the thread until the connection has been idle for keep_alive_s or is closed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.keep_alive_s
        while loop.time() < deadline and not conn.is_closing():
            await asyncio.sleep(min(CLOSED_POLL_S, max(0.0, deadline - loop.time())))
        self._held.pop(conn, None)
        self._hand_on()

    def _give_back(self, conn: object) -> None:
        watch = self._held.pop(conn, None)
        if watch is not None:
            watch.cancel()
        self._hand_on()

    def _hand_on(self) -> None:
        """A thread is free: to the longest waiting connection, else back to the pool."""
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1
