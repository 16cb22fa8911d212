"""Simulated llama-servers and misbehaving listeners in a background thread, for tests that drive
`loadgen` in-process (its sweep owns the main thread's event loop and signal handlers).

Everything listens on 127.0.0.1 on a free port and is stopped by `with`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from loadgen.sim import FaultConfig, load_profile, start_simulator


class LoopThread:
    """An event loop running in a daemon thread; `call(coro)` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="simbed", daemon=True)

    def __enter__(self) -> "LoopThread":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def call(self, coro: Awaitable[Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class SimThread:
    """`with SimThread(faults=[...]) as sim:` a simulated llama-server at `sim.url`.

    `restart()` stops it and starts a fresh one on the same port, as a restarted server would be.
    """

    def __init__(self, profile: str = "smoke", *, faults: list[str] | tuple[str, ...] = (), slots: int = 4,
                 time_scale: float = 0.05, seed: int = 0, port: int = 0, **options: Any):
        self.profile = load_profile(profile)
        self.faults = FaultConfig.parse(faults)
        self.kwargs = dict(slots=slots, time_scale=time_scale, seed=seed, faults=self.faults, **options)
        self.port = port
        self._loop = LoopThread()
        self.sim: Any = None

    @property
    def url(self) -> str:
        return self.sim.url

    async def _start(self) -> None:
        self.sim = await start_simulator(self.profile, host="127.0.0.1", port=self.port, **self.kwargs)
        self.port = self.sim.port

    def start(self) -> None:
        self._loop.call(self._start())

    def stop(self) -> None:
        if self.sim is not None:
            self._loop.call(self.sim.stop())
            self.sim = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def completion_requests(self) -> int:
        """Completion requests the simulator has received (the index its faults are chosen by)."""
        return self.sim.server._n_requests

    def __enter__(self) -> "SimThread":
        self._loop.__enter__()
        try:
            self.start()
        except BaseException:
            self._loop.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._loop.__exit__(None, None, None)


class RawListener:
    """A TCP listener on 127.0.0.1 that answers every connection with `respond(first bytes read)`.

    `respond` returns the bytes to send (then the connection is closed) — e.g. an SSH banner, an
    echo of the request, or random garbage — or None to send nothing and close.
    """

    def __init__(self, respond: Callable[[bytes], bytes | None]):
        self.respond = respond
        self._loop = LoopThread()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.read(65536), 5)
            answer = self.respond(first)
            if answer:
                writer.write(answer)
                await writer.drain()
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, family=socket.AF_INET)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def __enter__(self) -> "RawListener":
        self._loop.__enter__()
        self._loop.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.call(self._stop())
        finally:
            self._loop.__exit__(None, None, None)
