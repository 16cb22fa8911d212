"""The parent's side of `--workers` (run/workers.py `_Tail`), fed by hand: workers' records bytes and
their figures (`WorkerPartial`), as worker processes send them, in either order.

Direct (a JSON-lines records file, an observer that counts): the parent passes the bytes on and
adds the figures. Otherwise (here: a soak's windows read the records) it decodes every record.
Either way the level's figures are those of every record, the records file holds every record
once, and the send/completion times are settled as the level goes (not kept to its end).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from loadgen.analysis.aggregate import LevelAggregate
from loadgen.core.records import LevelRun, RequestRecord
from loadgen.core.recordsink import RecordSink
from loadgen.results.reader import load_records
from loadgen.run.recording import stream_level
from loadgen.run.worker_protocol import NO_MORE_SENDS, WorkerPartial
from loadgen.run.workers import WorkerHandle, _Tail

MS = 1_000_000


class FakeWorker(WorkerHandle):
    """A worker whose records file is a list of byte chunks handed out one per read."""

    def __init__(self, index: int):
        self.index, self.inbox, self.shift_ns, self.on_partial = index, asyncio.Queue(), 0, None
        self.chunks: list[bytes] = []

    async def read_records(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def end_level(self) -> None:
        pass


class Counting:
    """An observer that takes counts (the progress display's `requests_counted`)."""

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


def records_of(worker: int, n: int) -> list[RequestRecord]:
    """Worker `worker`'s n requests, one slot, back to back; every 5th failed."""
    out, t = [], 10**12 + worker * 300_000
    for i in range(n):
        failed = i % 5 == 4
        out.append(RequestRecord(target="t", level=4, worker=worker, seq=i * 2 + worker, salt=f"s{worker}-{i}",
                                 send_ns=t, complete_ns=t + (2 + i % 7) * MS, status=500 if failed else 200,
                                 error_kind="http_500" if failed else None, predicted_n=None if failed else 10))
        t += (3 + i % 7) * MS
    return out


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "records-read"])
@pytest.mark.parametrize("bytes_first", [True, False])
def test_the_tail_gives_every_records_figures_and_settles_as_it_goes(tmp_path: Path, direct: bool, bytes_first: bool):
    sink = RecordSink(tmp_path / "requests.jsonl")
    level = LevelRun(target="t", concurrency=4)
    windows: list[int] = []
    stream_level(level, sink, extra=None if direct else [lambda batch: windows.append(len(batch))])
    level.remote = True
    workers = [FakeWorker(0), FakeWorker(1)]
    observer = Counting(counts=direct)
    tail = _Tail(workers, level, observer)  # type: ignore[arg-type]
    assert tail.direct is direct
    encode = msgspec.json.Encoder().encode_lines
    mine = [records_of(k, 300) for k in (0, 1)]
    batches = [[rs[i:i + 50] for i in range(0, len(rs), 50)] for rs in mine]
    aggregates = [LevelAggregate(), LevelAggregate()]
    written = [0, 0]
    pending_peak = added_before_end = 0

    async def feed() -> None:
        nonlocal pending_peak, added_before_end
        for j in range(len(batches[0])):
            for k, worker in enumerate(workers):
                batch = batches[k][j]
                data = encode(batch)
                written[k] += len(data)
                aggregates[k].add_batch(batch, sample=False)
                last = j + 1 == len(batches[k])
                watermark = NO_MORE_SENDS if last else batches[k][j + 1][0].send_ns
                part = WorkerPartial(part=aggregates[k].partial(watermark), offset=written[k])
                aggregates[k].clear()
                cut = len(data) // 3  # a read may end inside a record
                if bytes_first:
                    worker.chunks += [data[:cut], data[cut:]]
                    await tail.read()
                    await tail.read()
                    worker.deliver(part)
                else:
                    worker.deliver(part)
                    worker.chunks += [data[:cut], data[cut:]]
                    await tail.read()
                    await tail.read()
                pending_peak = max(pending_peak, len(level.aggregate._pending()[0]))
        added_before_end = level.aggregate.sent
        await tail.close([True, True])
        level.records_done()

    asyncio.run(feed())
    sink.close()
    everything = [r for rs in mine for r in rs]
    summary, whole = level.aggregate.summary(4), LevelAggregate.of(everything).summary(4)
    assert (summary.requests_ok, summary.requests_failed, summary.concurrency_reached) == \
        (whole.requests_ok, whole.requests_failed, whole.concurrency_reached) == (480, 120, 2)
    assert (summary.latency_ms.p50, summary.latency_ms.p99, summary.latency_ms.count) == \
        (whole.latency_ms.p50, whole.latency_ms.p99, whole.latency_ms.count)
    assert summary.wall_s == whole.wall_s
    assert sorted(r.salt for r in load_records(tmp_path)) == sorted(r.salt for r in everything)
    assert (observer.done, observer.failed) == (600, 120)
    # settled as it went: every record's figures in before the end, never more than a few batches
    # of send and completion times held
    assert added_before_end >= 550 and pending_peak <= 4 * 2 * 50, (added_before_end, pending_peak)
    assert [h["latency"].get_total_count() for h in tail.histograms] == [240, 240]
    assert bool(windows) is not direct  # records reached the other consumers only when read
