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

Addresses: `auto` (the cluster `ray start` runs here), `HOST:PORT` (a head's GCS) or
`ray://HOST[:PORT]` (Ray Client, port 10001). Anything else is refused by `ray_endpoint` before Ray is
imported (Ray would take `bogus://x` for a module named bogus). Before a run, `reach_ray` opens one
TCP connection to the head with a short timeout: Ray itself retries an address that does not answer
for minutes, printing every retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any

import msgspec

from ...core.errors import ConfigError
from .child import Outlet, serve_inbox
from .parent import WorkerHandle, WorkerPool
from .protocol import FromWorker, ToWorker

RAY_INSTALL = "pip install 'loadgen[ray]'"
LOCAL = "local"  # --ray without an address: a cluster of this machine, for this run
AUTO = "auto"  # the cluster `ray start` runs on this machine, as Ray finds it
RAY_CLIENT_PORT = 10001  # ray://HOST without a port
RAY_CONNECT_TIMEOUT_S = 5.0  # for the head to accept a TCP connection, before Ray is asked to connect
_ADDRESS_HELP = "give HOST:PORT (a head's, e.g. 10.0.0.5:6379), ray://HOST:10001, auto, or --ray alone for a local cluster"


def ray_endpoint(address: str) -> tuple[str, int] | None:
    """The (host, port) an --ray address connects to; None for `local` and `auto` (no address to
    check yet). A ConfigError in one line for anything that is not an address Ray takes."""
    if address in (LOCAL, AUTO):
        return None
    if not address.isprintable() or " " in address:  # urlsplit would drop a newline or tab Ray would keep
        raise ConfigError(f"--ray {address!r} is not a Ray address; {_ADDRESS_HELP}")
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    elif scheme != "ray":
        raise ConfigError(f"--ray {address!r}: {scheme or 'an empty'} scheme is not Ray's; {_ADDRESS_HELP}")
    try:
        parts = urllib.parse.urlsplit("//" + rest)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if port is None and scheme == "ray":
        port = RAY_CLIENT_PORT
    if not host or not port or parts.path or parts.query or parts.fragment or parts.username is not None:
        raise ConfigError(f"--ray {address!r} is not a Ray address; {_ADDRESS_HELP}")
    return host, port


def reach_ray(address: str, ray: Any, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A ConfigError in one line unless the head at `address` accepts a TCP connection within
    `timeout_s` (`auto`: the address Ray finds, or that it finds none); `local` needs no check."""
    endpoint = ray_endpoint(address)
    if address == AUTO:
        endpoint = _auto_endpoint(ray)
    if endpoint is None:
        return
    host, port = endpoint
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except TimeoutError:
        raise ConfigError(f"--ray {address}: no answer from {host}:{port} within {timeout_s:g} s; "
                          "is the Ray head running there (ray start --head)?") from None
    except OSError as exc:
        raise ConfigError(f"--ray {address}: nothing answers at {host}:{port} ({exc.strerror or exc}); "
                          "is the Ray head running there (ray start --head)?") from None


def _auto_endpoint(ray: Any) -> tuple[str, int] | None:
    """The head `ray.init(address="auto")` would connect to, found as Ray finds it (RAY_ADDRESS, the
    last `ray start`); None when this Ray has no such function (ray.init then finds it itself)."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return None
    try:
        found = canonicalize_bootstrap_address(AUTO)
    except ConnectionError:
        raise ConfigError("--ray auto: no running Ray cluster on this machine; start one (ray start --head) "
                          "or give its address") from None
    except Exception as exc:  # noqa: BLE001 - RAY_ADDRESS or Ray's own file holds something that is no address
        raise ConfigError(f"--ray auto: Ray found no usable address ({_first_line(exc)})") from None
    return ray_endpoint(found) if found else None


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]

_encode = msgspec.msgpack.Encoder().encode
_decode_to_worker = msgspec.msgpack.Decoder(ToWorker).decode
_decode_from_worker = msgspec.msgpack.Decoder(FromWorker).decode


def import_ray() -> Any:
    """The `ray` module, or a ConfigError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


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
            raise ConfigError(f"--ray {self.address}: Ray could not start or connect ({_first_line(exc)})") from None
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
