"""A worker process of `--workers N`: runs the engine for its share of each level.

Started by the parent (run/workers/parent.py) as `python -m loadgen.run.workers.child`; it reads the
parent's messages on stdin and answers on stdout (run/workers/protocol.py). Every record it makes is
appended, renumbered as the level's (run/workers/merge.py: `level_seq`), to its records file within
`RecordsFile.WRITE_S` (a write per batch, never one per request), and the figures of what it wrote
go to the parent as parts, each sent after its records are written; if the process is killed the
parent still reads every record up to its last complete line. SIGINT is ignored: the
parent says when to stop (a terminal's Ctrl-C reaches the parent only; workers run in their own
session), and the kernel ends the worker if the parent dies (PR_SET_PDEATHSIG, set by the parent).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from ...analysis.aggregate import LevelAggregate, Reservoir
from ...client.backends import Backend, make_backend
from ...client.registry import make_transport
from ...client.transport import Transport
from ...core.clock import now_ns
from ...core.records import LevelRun, RequestRecord
from ..engine import EngineOptions, run_level, run_open_level
from ..looplag import LoopLagSampler
from ..loops import freeze_startup_heap, loop_factory
from ..salts import new_decimal_salt
from .merge import SendsSoFar, Share, level_seq
from .protocol import NO_MORE_SENDS, Go, LevelDone, Prepare, Ready, WorkerPartial, frame, read_to_worker


class FileOut:
    """Where a worker process's records go: its records file, appended to."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, data: bytes) -> None:
        while data:
            data = data[os.write(self._fd, data):]

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class Outlet:
    """How a worker talks back: `send` a message to the parent, `records(path)` opens where a
    level's records go (a file here; a buffer the parent drains in a Ray actor, run/workers/ray_actors.py)."""

    send: Callable[[Any], None]
    records: Callable[[str], Any]


class RecordsFile:
    """The engine's observer in a worker: appends the level's records to its outlet as they come,
    and gathers their figures for the parent (`aggregate.Partial`), so the parent adds figures and
    passes the records' bytes on without reading them.

    Records are written WRITE_S after the first of them completed, or at once when WRITE_RECORDS
    wait (a write per loop turn cost a microsecond a request); every GATHER_RECORDS records or
    GATHER_S seconds the records written since the last part are gathered into one and sent. A part's
    `watermark_ns` is the earliest send still in flight, or the gathering time when none is (the
    engine records a request before it leaves `in_flight`); the last part's is NO_MORE_SENDS.
    `offset` says how many bytes of records the parts sent so far cover (all written), `sends` what
    was sent and in flight then (every completed request's record is written by then): what the
    parent needs to record the requests in flight as lost if this process dies."""

    WRITE_S = 0.05
    WRITE_RECORDS = 1024
    GATHER_RECORDS = 2048
    GATHER_S = 0.25

    def __init__(self, level: LevelRun, share: Share, key: int | float, out: Any,
                 send: Callable[[Any], None] = lambda message: None):
        self.level, self.share, self.key = level, share, key
        self.reservoir = Reservoir(seed=share.index)  # the worker's sample of the level, sent with LevelDone
        self._aggregate = LevelAggregate()  # one batch's figures at a time (cleared, never remade)
        self._out, self._send = out, send
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._encode_lines = msgspec.json.Encoder().encode_lines
        self._encode = msgspec.msgpack.Encoder().encode
        self._waiting: list[RequestRecord] = []
        self._gathered_ns = now_ns()
        self.written = 0  # bytes of records written

    @property
    def records(self) -> int:
        return self.reservoir.seen + len(self._waiting)

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        pass

    def request_done(self, record: RequestRecord) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._timer = asyncio.get_running_loop().call_later(self.WRITE_S, self.flush)
        elif len(self.level.records) >= self.WRITE_RECORDS:
            self.flush()

    def flush(self) -> None:
        """Write every record the level holds, renumbered as the level's, and let them go."""
        if self._scheduled:
            self._scheduled = False
            assert self._timer is not None  # set whenever _scheduled is
            self._timer.cancel()
        records = self.level.records
        if records:
            share, first, key, replace = self.share, self.share.first_worker, self.key, msgspec.structs.replace
            batch = [replace(r, level=key, worker=r.worker + first, seq=level_seq(r.seq, share)) for r in records]
            records.clear()
            data = self._encode_lines(batch)
            self._out.write(data)
            self.written += len(data)
            self._waiting.extend(batch)
        if len(self._waiting) >= self.GATHER_RECORDS or now_ns() - self._gathered_ns >= self.GATHER_S * 1e9:
            self.gather()

    def gather(self, last: bool = False) -> None:
        """Send the parent a part of what was written since the last one (none when nothing was)."""
        batch, self._waiting = self._waiting, []
        self._gathered_ns = now_ns()
        if not batch and not last:
            return
        aggregate = self._aggregate
        aggregate.add_batch(batch, sample=False)
        self.reservoir.add(batch)
        in_flight = self.level.in_flight
        watermark = NO_MORE_SENDS if last else min((v[2] for v in in_flight.values()), default=self._gathered_ns)
        sends = b"" if last else self._encode(SendsSoFar(self._gathered_ns, self.reservoir.seen + len(in_flight),
                                                          dict(in_flight)))
        self._send(WorkerPartial(part=aggregate.partial(watermark), offset=self.written, sends=sends))
        aggregate.clear()

    def close(self) -> None:
        self.flush()
        self.gather(last=True)
        self._out.close()


class RenumberedBackend:
    """A backend that builds request s of this process as the level's request `level_seq(s)`, so a
    dataset's prompts go to the same requests as in one process (prompt i mod their count)."""

    def __init__(self, backend: Backend, share: Share):
        self._backend, self._share = backend, share
        self.name, self.method, self.path, self.stream = backend.name, backend.method, backend.path, backend.stream
        self.parse, self.event_reader = backend.parse, backend.event_reader

    def build(self, salt: str, index: int = 0) -> bytes:
        return self._backend.build(salt, level_seq(index, self._share))


class Worker:
    """The worker's state across levels: one transport per target, opened once."""

    def __init__(self) -> None:
        self.transports: dict[str, Transport] = {}
        self.heap_frozen = False  # freeze_startup_heap, once, before the first level (as the CLI does)

    async def transport(self, p: Prepare) -> Transport:
        if p.url not in self.transports:
            transport = make_transport(p.transport, p.url)
            await transport.open(p.url, p.pool, p.timeout_s, p.headers, insecure=p.insecure,
                                 close_streams=p.close_streams, stall_s=p.stall_s)
            self.transports[p.url] = transport
        return self.transports[p.url]

    async def close(self) -> None:
        for transport in self.transports.values():
            await transport.close()


async def _run_share(p: Prepare, start_ns: int, transport: Transport, backend: Any,
                     sink: RecordsFile) -> LevelDone:
    """The share's requests from `start_ns` on; the level's end as this process saw it."""
    level, share = sink.level, p.share
    options = EngineOptions(salt=new_decimal_salt if p.decimal_salt else None, give_up_after=p.give_up_after,
                            pause_after_connect_error_s=p.pause_after_connect_error_s)
    lag = LoopLagSampler().start()
    try:
        if p.rate is None:
            begin = start_ns + share.start_after_ns
            await asyncio.sleep(max(0, begin - now_ns()) / 1e9)
            duration = None if p.duration_s is None else max(0.0, p.duration_s - share.start_after_ns / 1e9)
            await run_level(level, transport, backend, requests=share.requests, duration_s=duration, observer=sink,
                            options=options, stagger_s=share.stagger_s)
        else:
            await run_open_level(level, transport, backend, share.offsets_ns or (), observer=sink, options=options,
                                 max_in_flight=share.concurrency or None, start_ns=start_ns)
    finally:
        load = lag.stop()
        sink.close()
    return LevelDone(
        start_ns=level.start_ns, end_ns=level.end_ns, stopped_reason=level.stopped_reason, records=sink.records,
        loop_lag_p99_ms=load.loop_lag_p99_ms, loop_lag_max_ms=load.loop_lag_max_ms,
        client_cpu_fraction=load.client_cpu_fraction, read_clock=transport.read_clock,
        sample=sink.reservoir.sample)


def _send(message: Any) -> None:
    data = frame(message)
    while data:
        data = data[os.write(1, data):]


async def _level(worker: Worker, p: Prepare, inbox: asyncio.Queue, outlet: Outlet) -> bool:
    """One level: prepare, wait for the go, run until done or stopped. False: the parent is gone."""
    try:
        transport = await worker.transport(p)
        await transport.connect_ahead(p.connect_ahead)
        backend = RenumberedBackend(make_backend(p.api, p.generation, p.model), p.share)
        level = LevelRun(target=p.label, concurrency=p.share.concurrency, rate=p.rate, prompt_tokens=p.prompt_tokens)
        sink = RecordsFile(level, p.share, p.level, outlet.records(p.records_path), outlet.send)
        if not worker.heap_frozen:
            worker.heap_frozen = True
            freeze_startup_heap()
    except Exception as exc:  # noqa: BLE001 - told to the parent, which reports it as the level's end
        outlet.send(Ready(pid=os.getpid(), host=socket.gethostname(), error=f"{type(exc).__name__}: {exc}"))
        return True
    outlet.send(Ready(pid=os.getpid(), host=socket.gethostname()))
    go = await inbox.get()
    if not isinstance(go, Go):
        sink.close()
        return go is not None
    running = asyncio.ensure_future(_run_share(p, go.start_ns, transport, backend, sink))
    listening = asyncio.ensure_future(inbox.get())
    await asyncio.wait({running, listening}, return_when=asyncio.FIRST_COMPLETED)
    parent_gone = listening.done() and listening.result() is None
    if not running.done():  # Stop, or the parent went away
        running.cancel()
    elif not listening.done():
        listening.cancel()
    try:
        done = await running
    except asyncio.CancelledError:
        done = LevelDone(start_ns=level.start_ns, end_ns=level.end_ns or now_ns(),
                         stopped_reason=level.stopped_reason or "interrupted", records=sink.records,
                         loop_lag_p99_ms=None, loop_lag_max_ms=None, client_cpu_fraction=None,
                         read_clock=transport.read_clock, sample=sink.reservoir.sample)
    if not parent_gone:
        outlet.send(done)
    return not parent_gone


async def serve_inbox(inbox: asyncio.Queue, outlet: Outlet) -> None:
    """Run the levels the parent's messages ask for until it goes (None in the inbox)."""
    worker = Worker()
    try:
        while True:
            message = await inbox.get()
            if message is None:
                return
            # A Go or Stop outside a level (a Stop that crossed the level's end) has nothing to do.
            if isinstance(message, Prepare) and not await _level(worker, message, inbox, outlet):
                return
    finally:
        await worker.close()


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    inbox: asyncio.Queue = asyncio.Queue()  # the parent's messages; None once it has gone

    async def listen() -> None:
        while (message := await read_to_worker(reader)) is not None:
            inbox.put_nowait(message)
        inbox.put_nowait(None)

    listener = asyncio.ensure_future(listen())
    try:
        await serve_inbox(inbox, Outlet(send=_send, records=FileOut))
    finally:
        listener.cancel()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    factory, _ = loop_factory()
    loop = factory()
    try:
        loop.run_until_complete(serve())
    finally:
        loop.close()


if __name__ == "__main__":
    main()
