"""`--workers N`: a sweep's levels run by N processes on this machine, merged into one level.

The parent keeps everything a one-process sweep does around a level (probing, warm-up, /metrics and
/slots sampling, the progress display, checkpoints); only the level's requests go to the workers
(run/workers/child.py), each with its own event loop and connections and its `Share` of the level
(run/workers/merge.py). A barrier starts them together: each prepares and says so, then all get one
start time. Each worker writes its records to a file of its own (a new one each level) and sends
the figures of each batch of them (`WorkerPartial`) through its pipe; the parent adds the figures to
the level's and has the kernel copy the batch's bytes into the run's records file (see `_Tail`):
the level reads as a one-process level would (and a worker killed mid-level loses nothing it had
written); their own load is kept per worker.

Ctrl-C: the parent tells every worker to stop, waits for each to record its in-flight requests as
cancelled, and reads their files to the end. A worker that cannot start its part ends the level
with a reason naming it. One that dies mid-level: the others run their shares to the end, every
record it wrote is kept, the requests it had in flight become records of error kind "lost" (from
what its last part said it had sent: run/workers/merge.py `lost_requests`), and the level says when it
died and at what concurrency (or rate) it ran from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from hdrh.histogram import HdrHistogram

from ...analysis.aggregate import PROCESS_HISTOGRAMS, add_series_part, merge_samples, of_level
from ...analysis.metrics import new_histogram
from ...core.clock import now_ns
from ...core.processes import usable_cores
from ...core.records import LevelRun, RequestRecord
from ...core.recordsink import LevelRecords
from ..config import SweepConfig
from ..engine import requests_done
from ..level_runner import TargetLoad
from ..looplag import ClientLoad, workers_warning
from ..salts import new_decimal_salt
from ..schedule import arrival_offsets_ns, connections_ahead
from ..state import RunObserver, TargetRun
from .merge import ProcessLoad, SendsSoFar, Share, add_histograms, busiest, closed_shares, lost_requests, open_shares
from .protocol import NO_MORE_SENDS, Go, LevelDone, Prepare, Ready, Stop, WorkerPartial, frame, read_from_worker

# Between the last worker saying it is ready and the level's start: time for every worker to get
# the start time and be waiting for it.
BARRIER_LEAD_NS = 50_000_000
TAIL_INTERVAL_S = 0.05
STOP_GRACE_S = 30.0  # after Stop, how long a worker may take to record its in-flight requests
_LEVEL_FILES = itertools.count(1)  # numbers the workers' records files of a level


class WorkerHandle:
    """The parent's side of one worker: messages to it, its answers in `inbox` (a `str` saying how
    it ended once it has), and the records of the level it runs.

    `shift_ns` is what to subtract from a worker's clock readings to put them on this process's
    monotonic clock: 0 on this machine (one clock), the difference of the two clocks' offsets to
    wall time on another (run/workers/ray_actors.py).
    """

    index: int
    inbox: asyncio.Queue
    shift_ns: int = 0
    on_partial: Callable[[WorkerPartial], None] | None = None  # the running level's, while one runs

    def deliver(self, message: Any) -> None:
        """A message from the worker: its figures to the running level, anything else to `inbox`."""
        if isinstance(message, WorkerPartial):
            if self.on_partial is not None:
                self.on_partial(message)
        else:
            self.inbox.put_nowait(message)

    # What each kind of worker answers for itself (_Process here, _RayActor in ray_actors.py):
    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def send(self, message: Any) -> None: ...

    def records_path(self, folder: Path) -> str:
        raise NotImplementedError

    def records_file(self) -> str | None:
        """The running level's records file when this process can read it as the worker writes it
        (a process on this machine); None when the records come only through `read_records`."""
        return None

    def exit_text(self) -> str | None:
        """How it ended ("killed by SIGKILL"), once known; None while that is not known."""
        return None

    async def read_records(self) -> bytes:
        """The bytes of records appended since the last call."""
        raise NotImplementedError

    def end_level(self) -> None: ...

    async def close(self) -> None: ...


@dataclass
class _Process(WorkerHandle):
    """A worker process on this machine: messages over its stdin/stdout, records through a file."""

    index: int
    proc: asyncio.subprocess.Process
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    reader: asyncio.Task | None = None
    on_partial: Callable[[WorkerPartial], None] | None = None
    _file: Any = None
    _path: Path | None = None

    @property
    def alive(self) -> bool:
        """Until its pipe is read to the end: every part it sent has been delivered by then."""
        return self.reader is not None and not self.reader.done()

    def send(self, message: Any) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.write(frame(message))

    def records_path(self, folder: Path) -> str:
        """A new file each level (numbered across the run: a restarted worker too), never one the
        run's records file may still be copying from."""
        self.end_level()
        self._path = folder / f"worker-{self.index}-{next(_LEVEL_FILES)}.jsonl"
        return str(self._path)

    def records_file(self) -> str | None:
        return None if self._path is None else str(self._path)

    def exit_text(self) -> str | None:
        return None if self.proc.returncode is None else _exit_text(self.proc.returncode)

    async def read_records(self) -> bytes:
        if self._file is None:
            assert self._path is not None  # records_path named it before the level's first read
            self._file = open(self._path, "rb")  # noqa: SIM115 (read level by level; end_level closes it) created before the worker said it was ready
        return self._file.read()

    def end_level(self) -> None:
        """Done with the level's records file: closed and unlinked (copies still queued hold it open)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._path)
            self._path = None

    async def close(self) -> None:
        self.end_level()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _after_death(level: LevelRun, shares: list[Share], deaths: dict[int, WorkerDeath], k: int) -> dict[str, Any]:
    """What run.json says of worker k that died mid-level: when, its requests lost, and the load the
    level offered from then on (the shares of the workers gone by then left out)."""
    death = deaths[k]
    gone = [d for d, x in deaths.items() if x.at_ns <= death.at_ns]
    info: dict[str, Any] = {"died_at_s": round(max(0, death.at_ns - level.start_ns) / 1e9, 3), "lost": death.lost}
    if level.rate is None:
        info["concurrency_after"] = level.concurrency - sum(shares[d].concurrency for d in gone)
    else:
        info["rate_after"] = level.rate * (1 - len(gone) / len(shares))
    return info


def _on_this_clock(r: RequestRecord, shift_ns: int) -> RequestRecord:
    def on(ns: int | None) -> int | None:
        return None if ns is None else ns - shift_ns

    return msgspec.structs.replace(r, send_ns=on(r.send_ns), complete_ns=on(r.complete_ns), headers_ns=on(r.headers_ns),
                                   intended_ns=on(r.intended_ns), first_token_ns=on(r.first_token_ns),
                                   last_token_ns=on(r.last_token_ns))


@dataclass(frozen=True)
class LevelPlan:
    """What the workers of a level were given: what `lost_requests` rebuilds a dead one's from."""

    shares: list[Share]
    start_ns: int
    duration_s: float | None
    pause_after_connect_error_ns: int = 0


@dataclass(frozen=True)
class WorkerDeath:
    """A worker gone mid-level: when (this clock), why, and how many of its requests were lost."""

    at_ns: int
    reason: str
    lost: int


class _Tail:
    """Follows a level's workers: their records into the run's file, their figures into the level.

    Every worker sends the figures of what it wrote as `WorkerPartial`s, each saying up to which
    byte of its records it covers; a part is taken once those bytes are the parent's to pass on, so
    the level's figures never count a record the records file does not hold (a Ray actor that dies
    takes its undrained records with it).

    Direct (the usual case): each part is added to the level's aggregate (`LevelAggregate.merge`)
    and the records it covers go to the records file as they are (`LevelRecords.encoded`); the
    parent decodes no record, and the progress display counts from the parts. A worker process on
    this machine has written a part's records to its file before it sends the part: the bytes
    between two parts are copied from that file by the kernel (`RecordSink.copy_lines`), and the
    parent never reads them. A Ray actor's records come drained as bytes (`read_records`), written
    as they are (`write_lines`), and kept until a part covers them. A worker that dies leaves
    records no part covers (written after its last one): they are decoded (from its file, or from
    the bytes kept) and added as records, as soon as the parent sees it gone.

    Otherwise (a records file that is not JSON lines of every record as they are, another machine's
    clock, a soak's windows, a live /metrics endpoint: whatever reads records) every record is
    read, decoded and appended to the level as a one-process level's are; parts give only the
    per-worker histograms and the watermarks.

    Either way the level's send/completion events are settled up to the earliest of the workers'
    watermarks (every request a worker sent before its watermark is in what was taken), so a level
    or a soak of hours over workers stays in constant memory. A dead worker's watermark is
    NO_MORE_SENDS: it sends nothing more.

    A worker gone before its last part (with a `plan`): the requests it had in flight, by its last
    part taken and the records after it, are added as records of error kind "lost" (`deaths`).
    """

    def __init__(self, handles: list[WorkerHandle], level: LevelRun, obs: RunObserver, plan: LevelPlan | None = None):
        self.handles, self.level, self.obs, self.plan = handles, level, obs, plan
        held = level.records
        self._count = getattr(obs, "requests_counted", None)
        self.direct = (isinstance(held, LevelRecords) and held.encoded is not None and level.aggregate is not None
                       and self._count is not None and not any(h.shift_ns for h in handles))
        self._settles = level.aggregate is not None and isinstance(held, LevelRecords)
        n = len(handles)
        self._rest = [b""] * n
        self._decode = msgspec.json.Decoder(RequestRecord).decode_lines
        # Per worker: its histograms of the level (PROCESS_HISTOGRAMS, from the parts taken), its
        # latest watermark on this clock, the bytes of complete records passed on, the parts not
        # taken yet, and (direct, drained) the bytes passed on since the last part taken, which no
        # part covers yet.
        self.histograms = [{name: new_histogram() for name in PROCESS_HISTOGRAMS} for _ in handles]
        self._watermarks: list[int | None] = [None] * n
        self._settled: int | None = None
        self._read = [0] * n
        self._parts: list[list[WorkerPartial]] = [[] for _ in handles]
        self._unmerged = [bytearray() for _ in handles]
        self._gone = [False] * n
        self._sends: list[bytes | None] = [None] * n  # the last part taken's `sends` (b"": its last part)
        self.deaths: dict[int, WorkerDeath] = {}
        self.error: str | None = None
        # Direct from the workers' own files: each open here for the level, for the kernel to copy from.
        self._files: list[int] = []
        self.copies = False
        paths = [h.records_file() for h in handles]
        if self.direct and all(paths):
            try:
                self._files.extend(os.open(path, os.O_RDONLY) for path in paths)  # type: ignore[arg-type]  # all(paths) above: none is None
                self.copies = True
            except OSError:  # then read as they grow, as a Ray actor's are
                self._close_files()
        for k, h in enumerate(handles):
            h.on_partial = functools.partial(self._received, k)

    def _received(self, k: int, message: WorkerPartial) -> None:
        """A part from worker k (called by its reader, which must not fail: the level would wait for
        the worker's end forever). A part that cannot be taken ends the level with why; one still in
        the pipe of a worker seen gone is not taken (its records were added as records)."""
        if self._gone[k]:
            return
        self._parts[k].append(message)
        try:
            self._take(k)
        except Exception as exc:  # noqa: BLE001 - a bug; said as the level's end, not a hang
            self._parts[k].clear()
            self.error = self.error or f"worker {k}'s figures could not be added: {type(exc).__name__}: {exc}"

    def _take(self, k: int) -> None:
        """Take worker k's parts whose records are the parent's to pass on: all of them when the
        worker writes to a file here (written before the part was sent), else those read."""
        parts, taken = self._parts[k], 0
        for message in parts:
            if not self.copies and message.offset > self._read[k]:
                break
            taken += 1
            part = message.part
            for name in PROCESS_HISTOGRAMS:
                if name in part.series:
                    add_series_part(self.histograms[k][name], part.series[name])
            if self.copies:
                self._copy(k, message.offset, part.sent)
            if self.direct:
                self.level.aggregate.merge(part)
                self._counted(part.sent, part.sent - part.ok)
            if not self.copies:
                del self._unmerged[k][:max(0, message.offset - (self._read[k] - len(self._unmerged[k])))]
            self._watermarks[k] = part.watermark_ns - self.handles[k].shift_ns
            self._sends[k] = message.sends
        if taken:
            del parts[:taken]
            self._settle()

    def _copy(self, k: int, end: int, records: int) -> None:
        """Worker k's records file up to byte `end` (`records` records) into the run's records file."""
        start = self._read[k]
        if end > start:
            self.level.records.encoded.copy_lines(self._files[k], start, end - start, records)
            self._read[k] = end

    def _settle(self) -> None:
        """Sweep the level's send and completion events up to the earliest of the workers' watermarks."""
        if not self._settles or None in self._watermarks:
            return
        watermark = min(self._watermarks)  # type: ignore[type-var]  # None in them returned above
        if watermark == self._settled:
            return
        self._settled = watermark
        if not self.direct:
            self.level.records.flush()  # the records read so far into the aggregate
        self.level.aggregate.settle(watermark)

    async def read(self) -> None:
        for k, h in enumerate(self.handles):
            if self._gone[k]:
                continue
            dead = not h.alive  # seen before reading: then this read gets all it wrote
            if not self.copies:
                await self._read_records(k, h)
            if dead:
                self.gone(k)

    async def _read_records(self, k: int, h: WorkerHandle) -> None:
        data = self._rest[k] + await h.read_records()
        cut = data.rfind(b"\n") + 1
        self._rest[k] = data[cut:]
        if cut:
            lines = data[:cut]
            self._unmerged[k] += lines  # until a part covers them (a dead worker's: what it sent after)
            if self.direct:
                self.level.records.encoded.write_lines(lines, lines.count(b"\n"))
            else:
                records = self._decode(lines)
                if h.shift_ns:
                    records = [_on_this_clock(r, h.shift_ns) for r in records]
                self.level.records.extend(records)  # a streamed level's one point (core/recordsink.py), or a list
                requests_done(self.obs, records)
            self._read[k] += len(lines)
            self._take(k)

    def gone(self, k: int) -> None:
        """Worker k sends nothing more (it died, or never answered): what it wrote after its last
        part taken is added as records; parts whose records never came are dropped."""
        if self._gone[k]:
            return
        self._gone[k] = True
        self._parts[k].clear()
        if self.copies:
            rest = self._rest_of_file(k)
            uncovered = rest[:rest.rfind(b"\n") + 1]  # a write the kill cut short is no record
        else:
            uncovered, self._unmerged[k] = bytes(self._unmerged[k]), bytearray()
        records = self._decode(uncovered)
        if self.direct and records:
            if self.copies:
                self._copy(k, self._read[k] + len(uncovered), len(records))
            self.level.aggregate.add_batch(records)
            self._counted(len(records), sum(r.error_kind is not None for r in records))
        if self.plan is not None and self._sends[k] != b"":  # b"": its last part came, nothing was in flight
            self._add_lost(k, self.plan, [_on_this_clock(r, self.handles[k].shift_ns) for r in records]
                           if self.handles[k].shift_ns else records)
        self._watermarks[k] = NO_MORE_SENDS
        self._settle()

    def _counted(self, completed: int, failed: int) -> None:
        """Tell the observer of records added to the level's aggregate (`direct` only)."""
        assert self._count is not None  # `direct` is set only for an observer that counts
        self._count(self.level, completed, failed)

    def _add_lost(self, k: int, plan: LevelPlan, since: list[RequestRecord]) -> None:
        """Worker k's requests in flight when it went, as records of error kind "lost"."""
        h, now, sent = self.handles[k], now_ns(), self._sends[k]
        how = h.exit_text() or (None if h.alive else "gone")
        reason = f"worker {k} died ({how})" if how else f"worker {k} did not answer"
        sends = None if sent is None else msgspec.msgpack.decode(sent, type=SendsSoFar)
        if sends is not None and h.shift_ns:
            sends = SendsSoFar(sends.at_ns - h.shift_ns, sends.sent, {
                seq: (w, salt, send - h.shift_ns, None if intended is None else intended - h.shift_ns)
                for seq, (w, salt, send, intended) in sends.in_flight.items()})
        lost = lost_requests(plan.shares[k], sends, since, target=self.level.target, key=self.level.level,
                             start_ns=plan.start_ns, death_ns=now, duration_s=plan.duration_s, reason=reason,
                             pause_after_connect_error_ns=plan.pause_after_connect_error_ns)
        self.deaths[k] = WorkerDeath(now, how or "did not answer", len(lost))
        if not lost:
            return
        if self.direct:
            self.level.records.encoded.write_lines(msgspec.json.Encoder().encode_lines(lost), len(lost))
            self.level.aggregate.add_batch(lost)
            self._counted(len(lost), len(lost))
        else:
            self.level.records.extend(lost)
            requests_done(self.obs, lost)

    def _rest_of_file(self, k: int) -> bytes:
        chunks, at = [], self._read[k]
        while chunk := os.pread(self._files[k], 1 << 20, at):
            chunks.append(chunk)
            at += len(chunk)
        return b"".join(chunks)

    async def follow(self, stop: asyncio.Event) -> None:
        """Read every TAIL_INTERVAL_S until `stop` is set (never cancelled in a read: a Ray
        worker's drained records would be lost with it)."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), TAIL_INTERVAL_S)
            await self.read()

    async def close(self, ended: list[bool]) -> None:
        """Read to the end; `ended[k]`: worker k said its level was done (else it died or never answered)."""
        try:
            await self.read()
            for k in range(len(self.handles)):
                if not ended[k]:
                    self.gone(k)
        finally:
            for h in self.handles:
                h.end_level()
                h.on_partial = None
            self._close_files()

    def _close_files(self) -> None:
        """The workers' files, each closed once the copies queued from it are done."""
        for fd in self._files:
            if self.copies:
                self.level.records.encoded.close_after(fd)
            else:
                os.close(fd)
        self._files = []


class WorkerPool:
    """N worker processes for a run; `async with` starts them and sees them gone.

    `preexec_fn` runs in each child before it starts (the CLI passes `die_with_parent`, so no worker
    outlives the parent however it exits). `folder` holds the workers' records files.
    """

    def __init__(self, processes: int, folder: Path, preexec_fn: Callable[[], None] | None = None):
        self.size, self.folder, self.preexec_fn = processes, folder, preexec_fn
        self.processes: list[WorkerHandle | None] = [None] * processes
        # (target, level) -> metric -> [each worker's histogram]; see `merged_histograms`.
        self.histograms: dict[tuple[str, int | float], dict[str, list[HdrHistogram]]] = {}

    async def __aenter__(self) -> WorkerPool:
        self.folder.mkdir(parents=True, exist_ok=True)
        for k in range(self.size):
            await self._start(k)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start(self, k: int) -> WorkerHandle:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadgen.run.workers.child", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, start_new_session=True, preexec_fn=self.preexec_fn)
        p = _Process(k, proc)
        p.reader = asyncio.ensure_future(self._read(p))
        self.processes[k] = p
        return p

    async def _read(self, p: _Process) -> None:
        assert p.proc.stdout is not None
        while (message := await read_from_worker(p.proc.stdout)) is not None:
            p.deliver(message)
        p.inbox.put_nowait(_exit_text(await p.proc.wait()))

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.processes if p is not None))

    def merged_histograms(self) -> dict[tuple[str, int | float], dict[str, tuple[list[HdrHistogram], HdrHistogram]]]:
        """Per target and level, per metric: every worker's histogram and their sum."""
        return {key: {m: (hs, add_histograms(hs)) for m, hs in metrics.items()}
                for key, metrics in self.histograms.items()}

    def shares(self, config: SweepConfig, level: LevelRun) -> tuple[list[Share], int | None, float | None]:
        """The level's shares, and its budget as the progress display counts it."""
        requests, duration_s = config.budget(level.level)
        if level.rate is None:
            return closed_shares(level.concurrency, self.size, requests if duration_s is None else None,
                                 config.stagger_s), requests, duration_s
        offsets = arrival_offsets_ns(level.rate, requests=requests, duration_s=duration_s, arrival=config.arrival,
                                     burstiness=config.burstiness, seed=config.arrival_seed + level.seed_offset)
        return open_shares(offsets, self.size, config.max_in_flight), len(offsets), None

    async def connect_ahead(self, load: TargetLoad, level: LevelRun, latency_s: float | None) -> None:
        """Nothing here: each worker opens its share's connections before the level's start (`Prepare`)."""

    async def run(self, load: TargetLoad, level: LevelRun) -> str | None:
        """Run `level` on the workers, filling it as a one-process level, its client load the busiest
        worker's; each worker whose load limited the level is named in a warning given here (so
        None is returned)."""
        config, t, generation, options, obs = load.config, load.target, load.generation, load.options, load.obs
        level.remote = True
        shares, requests, duration_s = self.shares(config, level)
        if level.rate is not None:
            level.scheduled = requests  # the whole schedule, shared out
        pool = config.connections_per_target
        procs = [p if (p := self.processes[k]) is not None and p.alive else await self._start(k)
                 for k in range(len(shares))]
        paths = [p.records_path(self.folder) for p in procs]
        for p, share, path in zip(procs, shares, paths):
            p.send(Prepare(
                url=t.target.url, label=t.label, api=config.api, model=t.model, generation=generation,
                transport=config.transport, timeout_s=config.timeout_s, stall_s=config.stall_s,
                headers=config.auth_headers(),
                insecure=config.insecure, close_streams=t.info.closes_streams if t.info else True,
                pool=math.ceil(pool / self.size) if pool else 0, decimal_salt=options.salt is new_decimal_salt,
                give_up_after=options.give_up_after, level=level.level, rate=level.rate,
                prompt_tokens=level.prompt_tokens, share=share, duration_s=duration_s, records_path=path,
                pause_after_connect_error_s=options.pause_after_connect_error_s,
                connect_ahead=connections_ahead(share.concurrency, level.rate, requests=share.requests,
                                                latency_s=None)))
        answers = [await p.inbox.get() for p in procs]
        failed = [(k, a if isinstance(a, str) else a.error) for k, a in enumerate(answers)
                  if not isinstance(a, Ready) or a.error]
        if failed:
            for p, a in zip(procs, answers):
                if isinstance(a, Ready) and not a.error:
                    p.send(Stop())
            level.start_ns = level.end_ns = now_ns()
            level.stopped_reason, level.finished = f"worker {failed[0][0]} could not start: {failed[0][1]}", True
            for p in procs:
                p.end_level()
            return None
        await self._go(t, level, procs, shares, answers, requests, duration_s, obs,
                       int(options.pause_after_connect_error_s * 1e9))
        return None

    async def _go(self, t: TargetRun, level: LevelRun, procs: list[WorkerHandle], shares: list[Share],
                  readies: list[Any], requests: int | None, duration_s: float | None,
                  obs: RunObserver, pause_after_connect_error_ns: int = 0) -> ClientLoad | None:
        start = now_ns() + BARRIER_LEAD_NS
        level.start_ns = start
        obs.level_started(level, requests, duration_s)
        tail = _Tail(procs, level, obs, LevelPlan(shares, start, duration_s, pause_after_connect_error_ns))
        stop_following = asyncio.Event()
        follower = asyncio.ensure_future(tail.follow(stop_following))
        ends: list[Any] = [None] * len(procs)
        try:
            for p in procs:
                p.send(Go(start_ns=start + p.shift_ns))
            for k, p in enumerate(procs):
                ends[k] = await p.inbox.get()
        except asyncio.CancelledError:
            for p in procs:
                p.send(Stop())
            for k, p in enumerate(procs):
                if ends[k] is None:
                    with contextlib.suppress(asyncio.TimeoutError):
                        ends[k] = await asyncio.wait_for(asyncio.shield(p.inbox.get()), STOP_GRACE_S)
            level.stopped_reason = level.stopped_reason or "interrupted"
            raise
        finally:
            stop_following.set()
            try:
                await follower
            finally:
                await tail.close([isinstance(e, LevelDone) for e in ends])
            level.records_done()  # a streamed level hands on the records it still holds
            if tail.error:
                level.stopped_reason = level.stopped_reason or tail.error
            if tail.direct:
                level.aggregate.sample = merge_samples([(e.records, e.sample) for e in ends if isinstance(e, LevelDone)])
            load = self._merge(t, level, shares, readies, ends, [p.shift_ns for p in procs], tail, obs)
            level.finished = True
        return load

    def _merge(self, t: TargetRun, level: LevelRun, shares: list[Share], readies: list[Any], ends: list[Any],
               shifts: list[int], tail: _Tail, obs: RunObserver) -> ClientLoad | None:
        """The workers' ends folded into the level: its end, why it stopped, per-worker figures."""
        level.end_ns = max([e.end_ns - shift for e, shift in zip(ends, shifts) if isinstance(e, LevelDone)],
                           default=now_ns())
        reasons = [f"worker {k} {e}" if isinstance(e, str) else e.stopped_reason for k, e in enumerate(ends)
                   if e is None or isinstance(e, str) or e.stopped_reason]
        if reasons and level.stopped_reason is None:
            level.stopped_reason = str(reasons[0] or "interrupted")
        loads, level.workers = [], []
        key = (level.target, level.level)
        for k, (share, ready, end) in enumerate(zip(shares, readies, ends)):
            info: dict[str, Any] = {"worker": k, "host": ready.host, "pid": ready.pid,
                                    "concurrency": share.concurrency, "requests": share.requests,
                                    "first_worker": share.first_worker}
            if isinstance(end, LevelDone):
                info.update(records=end.records, stopped_reason=end.stopped_reason, loop_lag_p99_ms=end.loop_lag_p99_ms,
                            loop_lag_max_ms=end.loop_lag_max_ms, client_cpu_fraction=end.client_cpu_fraction)
                loads.append(ProcessLoad(k, end.loop_lag_p99_ms, end.loop_lag_max_ms, end.client_cpu_fraction))
                for metric, histogram in tail.histograms[k].items():
                    if histogram.get_total_count():
                        self.histograms.setdefault(key, {}).setdefault(metric, []).append(histogram)
                t.read_clock = end.read_clock or t.read_clock
            else:
                info.update(records=None, stopped_reason=end if isinstance(end, str) else "no answer")
            if k in tail.deaths:
                info.update(_after_death(level, shares, tail.deaths, k))
            level.workers.append(info)
        top = busiest(loads)
        if top is None:
            return None
        level.loop_lag_p99_ms, level.loop_lag_max_ms = top.loop_lag_p99_ms, top.loop_lag_max_ms
        level.client_cpu_fraction = top.client_cpu_fraction
        own = [ClientLoad(x.loop_lag_p99_ms, x.loop_lag_max_ms, x.client_cpu_fraction or 0.0, 0) for x in loads]
        warning = workers_warning(own, usable_cores(), t.read_clock or "loop")
        if warning and of_level(level).ok:  # one line for all the workers, not one each
            obs.message(f"warning: {t.label} at {level.name}: {warning}")
        return ClientLoad(top.loop_lag_p99_ms, top.loop_lag_max_ms, top.client_cpu_fraction or 0.0, 0)
