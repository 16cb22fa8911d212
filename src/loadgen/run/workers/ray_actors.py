"""`--ray [ADDRESS]`: the workers of `--workers` as Ray async actors, placed across a Ray cluster.

Each actor runs the same worker as a process of `--workers` (run/workers/child.py: `serve_inbox`)
on the actor's own event loop; only the way messages and records travel differs. The parent puts
messages into the actor and awaits its answers, and drains its records (bytes of JSON lines kept
in the actor since the last drain) as a worker process's file is read. Actors are spread over the
cluster's nodes (`SPREAD`), one CPU each.

Clocks: a worker on another machine has another monotonic clock. Latencies are differences of one
worker's readings and stay exact; absolute times (the level's start, every record's times) are put
on the parent's clock through each side's offset of monotonic to wall time, measured when the actor
starts (`shift_ns`; 0 on the parent's own machine, where there is one clock). Each level's
`workers` in run.json names the host of each worker.

Ray is an optional extra (`pip install 'loadgen[ray]'`): it is large. Without an address a local
cluster is started for the run and shut down with it, so no Ray process it started outlives it.

The address of `--ray` and its check before Ray is imported are ray_address.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from pathlib import Path
from typing import Any

import msgspec

from ...core.errors import ConfigError
from .child import Outlet, serve_inbox
from .parent import WorkerHandle, WorkerPool
from .protocol import FromWorker, ToWorker
from .ray_address import LOCAL, first_line, import_ray

_encode = msgspec.msgpack.Encoder().encode
_decode_to_worker = msgspec.msgpack.Decoder(ToWorker).decode
_decode_from_worker = msgspec.msgpack.Decoder(FromWorker).decode


class _Buffer:
    """A level's records in an actor, until the parent drains them."""

    def __init__(self, data: bytearray):
        self._data = data

    def write(self, chunk: bytes) -> None:
        self._data += chunk

    def close(self) -> None:
        pass


class RayWorker:
    """The actor's body (made a Ray actor class by `RayPool`); every method runs on its event loop."""

    def __init__(self) -> None:
        self._records = bytearray()
        self._inbox: asyncio.Queue | None = None
        self._outbox: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    def _started(self) -> tuple[asyncio.Queue, asyncio.Queue]:
        if self._inbox is None or self._outbox is None:
            self._inbox, self._outbox = asyncio.Queue(), asyncio.Queue()
            outlet = Outlet(send=self._outbox.put_nowait, records=lambda _path: _Buffer(self._records))
            self._task = asyncio.ensure_future(serve_inbox(self._inbox, outlet))
        return self._inbox, self._outbox

    async def clock(self) -> tuple[int, int, str]:
        """(wall ns, monotonic ns, host) read together."""
        return time.time_ns(), time.monotonic_ns(), socket.gethostname()

    async def put(self, message: bytes) -> None:
        inbox, _ = self._started()
        inbox.put_nowait(_decode_to_worker(message))

    async def get(self) -> bytes:
        _, outbox = self._started()
        return _encode(await outbox.get())

    async def drain(self) -> bytes:
        data = bytes(self._records)
        self._records.clear()
        return data

    async def close(self) -> None:
        inbox, _ = self._started()
        inbox.put_nowait(None)
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task


class _RayActor(WorkerHandle):
    """The parent's side of one actor."""

    def __init__(self, index: int, ray: Any, actor: Any, shift_ns: int):
        self.index, self.ray, self.actor, self.shift_ns = index, ray, actor, shift_ns
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.on_partial = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                self.deliver(_decode_from_worker(await self.actor.get.remote()))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the actor died (its node went away, it was killed)
            self.inbox.put_nowait(f"ended: {type(exc).__name__}")

    @property
    def alive(self) -> bool:
        return not self.reader.done()

    def send(self, message: Any) -> None:
        self.actor.put.remote(_encode(message))

    def records_path(self, folder: Path) -> str:
        return ""

    async def read_records(self) -> bytes:
        try:
            return await self.actor.drain.remote()
        except Exception:  # noqa: BLE001 - a dead actor has nothing more to give
            return b""

    def end_level(self) -> None:
        pass

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.actor.close.remote(), 10)
        self.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader
        with contextlib.suppress(Exception):
            self.ray.kill(self.actor)


class RayPool(WorkerPool):
    """`processes` actors on the Ray cluster at `address` (LOCAL: one started for this run; `auto`:
    the running one Ray finds). `processes` 0: one per CPU of the cluster."""

    def __init__(self, processes: int, address: str, folder: Path):
        super().__init__(processes, folder)
        self.address = address
        self._ray: Any = None
        self._actor_class: Any = None

    async def __aenter__(self) -> RayPool:
        ray = self._ray = import_ray()
        try:
            if self.address == LOCAL:
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
            else:
                ray.init(address=self.address, log_to_driver=False, configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises for a cluster it cannot start or reach
            raise ConfigError(f"--ray {self.address}: Ray could not start or connect ({first_line(exc)})") from None
        if self.size == 0:
            self.size = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self.processes = [None] * self.size
        self._actor_class = ray.remote(RayWorker).options(num_cpus=1, scheduling_strategy="SPREAD")
        for k in range(self.size):
            await self._start(k)
        return self

    async def _start(self, k: int) -> WorkerHandle:
        actor = self._actor_class.remote()
        wall0, mono0 = time.time_ns(), time.monotonic_ns()
        wall, mono, host = await actor.clock.remote()
        here = socket.gethostname()
        shift = 0 if host == here else (wall0 - mono0) - (wall - mono)
        handle = _RayActor(k, self._ray, actor, shift)
        self.processes[k] = handle
        return handle

    async def close(self) -> None:
        await super().close()
        if self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()
