"""The parent's side of `--workers` (run/workers/parent.py `_Tail`), fed by hand: workers' records bytes and
their figures (`WorkerPartial`), as worker processes send them, in either order.

Direct (a JSON-lines records file, an observer that counts): the parent passes the bytes on and
adds the figures; "copied": from the worker's own file, which it never reads (a worker process
here), "drained": bytes handed to it (a Ray actor). Otherwise ("records-read": a soak's windows
read the records) it decodes every record.
Either way the level's figures are those of every record in the file (a part is taken only once
its records are read), the records file holds every record once, and the send/completion times
are settled as the level goes, up to the earliest of the workers' watermarks.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import msgspec
import pytest

from loadgen.analysis.aggregate import LevelAggregate
from loadgen.core.records import LevelRun, RequestRecord
from loadgen.core.recordsink import RecordSink
from loadgen.results.reader import load_records
from loadgen.run.recording import stream_level
from loadgen.run.workers.parent import WorkerHandle, _Tail
from loadgen.run.workers.protocol import NO_MORE_SENDS, WorkerPartial

MS = 1_000_000
BATCH = 40


class FakeWorker(WorkerHandle):
    """A worker whose records are byte chunks handed out one per read, or (`file`) appended to a
    file as a worker process writes them."""

    def __init__(self, index: int, file: Path | None = None):
        self.index, self.inbox, self.shift_ns, self.on_partial = index, asyncio.Queue(), 0, None
        self.chunks: list[bytes] = []
        self.dead = False
        self.file = file
        if file is not None:
            file.write_bytes(b"")

    def write(self, data: bytes) -> None:
        if self.file is None:
            self.chunks.append(data)
        else:
            with self.file.open("ab") as f:
                f.write(data)

    @property
    def alive(self) -> bool:
        return not self.dead

    def records_file(self) -> str | None:
        return None if self.file is None else str(self.file)

    async def read_records(self) -> bytes:
        assert self.file is None, "a worker's own file is copied, never read"
        return self.chunks.pop(0) if self.chunks else b""

    def end_level(self) -> None:
        pass


class Counting:
    """An observer that takes counts (the progress display's `requests_counted`), or records."""

    def __init__(self, counts: bool):
        self.done = self.failed = 0
        if counts:
            self.requests_counted = self._counted

    def _counted(self, level: LevelRun, completed: int, failed: int) -> None:
        self.done += completed
        self.failed += failed

    def request_done(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += record.error_kind is not None


def records_of(worker: int, n: int, seed: int) -> list[RequestRecord]:
    """Worker `worker`'s n requests on 3 slots of its own (closed loop, durations 1-30 ms, every 5th
    failed), in the order they completed, as a worker writes them."""
    rng = random.Random(seed)
    free = [10**12 + worker * 7 * MS + slot * 2 * MS for slot in range(3)]
    out = []
    for i in range(n):
        slot = min(range(3), key=lambda s: free[s])
        send, duration = free[slot], rng.randint(1, 30) * MS
        failed = i % 5 == 4
        out.append(RequestRecord(target="t", level=6, worker=worker * 3 + slot, seq=i * 2 + worker, salt=f"s{worker}-{i}",
                                 send_ns=send, complete_ns=send + duration, status=500 if failed else 200,
                                 error_kind="http_500" if failed else None, predicted_n=None if failed else 10))
        free[slot] = send + duration
    return sorted(out, key=lambda r: r.complete_ns)


def watermark_after(rs: list[RequestRecord], done: int) -> int:
    """The worker's watermark once its first `done` records are written: its earliest send still
    in flight then, or the moment the last of them completed when none is."""
    now = rs[done - 1].complete_ns
    in_flight = [r.send_ns for r in rs[done:] if r.send_ns <= now]
    return min(in_flight, default=now)


def worker_stream(rs: list[RequestRecord]):
    """What a worker sends, batch by batch: (bytes of its records, its part)."""
    encode, aggregate, written = msgspec.json.Encoder().encode_lines, LevelAggregate(), 0
    for i in range(0, len(rs), BATCH):
        batch = rs[i:i + BATCH]
        data = encode(batch)
        written += len(data)
        aggregate.add_batch(batch, sample=False)
        last = i + BATCH >= len(rs)
        watermark = NO_MORE_SENDS if last else watermark_after(rs, i + len(batch))
        yield data, WorkerPartial(part=aggregate.partial(watermark), offset=written)
        aggregate.clear()


MODES = ["copied", "drained", "records-read"]


def fake_workers(mode: str, n: int, tmp_path: Path) -> list[FakeWorker]:
    return [FakeWorker(k, tmp_path / f"worker-{k}.jsonl" if mode == "copied" else None) for k in range(n)]


@pytest.mark.parametrize("mode,bytes_first", [("copied", True), ("drained", True), ("drained", False),
                                              ("records-read", True), ("records-read", False)])
def test_the_tail_gives_every_records_figures_and_settles_as_it_goes(tmp_path: Path, mode: str, bytes_first: bool):
    # "copied" only bytes first: a worker process writes a part's records before it sends the part
    direct = mode != "records-read"
    sink = RecordSink(tmp_path / "requests.jsonl")
    level = LevelRun(target="t", concurrency=6)
    windows: list[int] = []
    stream_level(level, sink, extra=None if direct else [lambda batch: windows.append(len(batch))])
    level.remote = True
    workers = fake_workers(mode, 2, tmp_path)
    open_before = len(os.listdir("/proc/self/fd"))
    observer = Counting(counts=direct)
    tail = _Tail(workers, level, observer)  # type: ignore[arg-type]
    assert (tail.direct, tail.copies) == (direct, mode == "copied")
    mine = [records_of(0, 400, seed=1), records_of(1, 400, seed=2)]
    streams = [list(worker_stream(rs)) for rs in mine]
    held = {"pending": 0, "unmerged": 0, "added": 0}

    async def send(k: int, j: int) -> None:
        data, part = streams[k][j]
        cut = len(data) // 3  # a read may end inside a record
        if not bytes_first:
            workers[k].deliver(part)
        workers[k].write(data[:cut])
        workers[k].write(data[cut:])
        await tail.read()
        await tail.read()
        if bytes_first:
            workers[k].deliver(part)
        held["pending"] = max(held["pending"], len(level.aggregate._pending()[0]))
        held["unmerged"] = max(held["unmerged"], *(len(b) for b in tail._unmerged))

    async def feed() -> None:
        # worker 0 runs three batches ahead of worker 1: settling at the later worker's watermark
        # would sweep worker 1's sends before they are known
        n = len(streams[0])
        for j in range(n + 3):
            if j < n:
                await send(0, j)
            if j >= 3:
                await send(1, j - 3)
        held["added"] = level.aggregate.sent
        await tail.close([True, True])
        level.records_done()

    asyncio.run(feed())
    sink.close()
    assert len(os.listdir("/proc/self/fd")) == open_before - 1  # the workers' files closed once copied, and the sink
    everything = [r for rs in mine for r in rs]
    summary, whole = level.aggregate.summary(6), LevelAggregate.of(everything).summary(6)
    assert whole.concurrency_reached == 6
    assert (summary.requests_ok, summary.requests_failed, summary.concurrency_reached) == \
        (whole.requests_ok, whole.requests_failed, whole.concurrency_reached) == (640, 160, 6)
    assert (summary.latency_ms.p50, summary.latency_ms.p99, summary.latency_ms.count) == \
        (whole.latency_ms.p50, whole.latency_ms.p99, whole.latency_ms.count)
    assert summary.wall_s == whole.wall_s
    assert sorted(r.salt for r in load_records(tmp_path)) == sorted(r.salt for r in everything)
    assert (observer.done, observer.failed) == (800, 160)
    # settled as it went: every record's figures in before the end, never more than a few batches of
    # send and completion times held, nor more than a batch of bytes kept for a worker that may die
    assert held["added"] >= 700 and held["pending"] <= 2 * 6 * BATCH, held
    assert held["unmerged"] <= 2 * len(streams[0][0][0]), held
    assert [h["latency"].get_total_count() for h in tail.histograms] == [320, 320]
    assert bool(windows) is not direct  # records reached the other consumers only when read


@pytest.mark.parametrize("mode", MODES)
def test_figures_never_count_records_the_file_lacks_and_a_dead_workers_last_records_count(tmp_path: Path, mode):
    direct = mode != "records-read"
    sink = RecordSink(tmp_path / "requests.jsonl")
    level = LevelRun(target="t", concurrency=3)
    stream_level(level, sink, extra=None if direct else [lambda batch: None])
    level.remote = True
    [worker] = fake_workers(mode, 1, tmp_path)
    tail = _Tail([worker], level, Counting(counts=direct))  # type: ignore[arg-type]
    rs = records_of(0, 5 * BATCH, seed=3)
    stream = list(worker_stream(rs))

    async def feed() -> tuple[int, int]:
        for data, part in stream[:2]:
            worker.write(data)
            await tail.read()
            worker.deliver(part)
        data, part = stream[2]
        if mode == "copied":  # its records are in the worker's file before the part comes
            worker.write(data)
        # a drained part whose records have not been read yet: not counted (a Ray actor dying now loses them)
        worker.deliver(part)
        level.records.flush()
        before_read = level.aggregate.sent
        if mode != "copied":
            worker.write(data)
        await tail.read()
        level.records.flush()
        after_read = level.aggregate.sent
        # the worker writes one more batch and dies before its part: those records count too; and
        # (a file) the start of a write the kill cut short, which is no record
        worker.write(stream[3][0])
        if mode == "copied":
            worker.write(stream[4][0][:100])
        worker.dead = True
        await tail.read()
        # its part of them still in the pipe when it was seen gone: they were counted as records
        worker.deliver(stream[3][1])
        await tail.close([False])
        level.records_done()
        return before_read, after_read

    before_read, after_read = asyncio.run(feed())
    sink.close()
    assert (before_read, after_read) == ((3 if mode == "copied" else 2) * BATCH, 3 * BATCH)
    in_file = load_records(tmp_path)
    assert len(in_file) == 4 * BATCH
    summary = level.aggregate.summary(3)
    assert summary.requests_ok + summary.requests_failed == 4 * BATCH
    assert summary.concurrency_reached == LevelAggregate.of(in_file).summary(3).concurrency_reached == 3
