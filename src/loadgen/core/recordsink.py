"""Where completed records go during a run: appended to the records file as they complete.

`LevelRecords` is the one point every completed request passes (`append`): it gathers a batch and,
every BATCH_RECORDS records or BATCH_SECONDS, hands it to its consumers (a level's streaming
aggregate, the run's `RecordSink`, a live-metrics observer) and forgets it. Nothing per request stays
in memory after its batch is written, unless the level keeps its records (`keep=True`: prefill and
depth steps, a handful of requests each, which their analysis reads whole).

`RecordSink` encodes a batch on the event loop (msgspec, ~1 µs a record) and gives the bytes to a
writer thread, which appends them to the file with unbuffered writes. So the loop never waits for
the disk, and the file always ends at a batch's last newline except during one `write` call: a
killed loadgen (SIGKILL, OOM) leaves a file readable up to its last complete record, having lost
at most the batch in hand. `keep` ("all", "errors", "none") says which records are written.
Records already encoded (a worker process's, run/workers/parent.py) are written as they are
(`write_lines`), or copied by the kernel from the worker's own records file (`copy_lines`), so the
process that runs the workers never holds their bytes.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .clock import now_ns
from .records import ProbeSample, RequestRecord, encode_lines

BATCH_RECORDS = 4096
BATCH_SECONDS = 0.5
RECORDS_KEPT = ("all", "errors", "none")
RECORDS_FORMATS = ("jsonl", "parquet")
PARQUET_ROW_GROUP = 65536  # records per Parquet row group (held as Arrow columns, ~100 B each, until written)

Batch = list[RequestRecord]


class RecordSink:
    """Appends records to `path` from a writer thread. Thread-safe `write`; `close` once.

    format "jsonl": JSON lines, encoded on the caller's thread, written as they come. "parquet"
    (core/columnar.py): each batch is turned into Arrow columns on the caller's thread (the work
    holds the interpreter either way, and a thread doing it fell behind a fast run and queued
    records), and the thread writes a row group every PARQUET_ROW_GROUP records; the file is
    readable once closed (a killed run leaves none readable: JSON lines survive a kill).
    """

    def __init__(self, path: Path, keep: str = "all", secrets: tuple[str, ...] = (), format: str = "jsonl") -> None:
        if keep not in RECORDS_KEPT or format not in RECORDS_FORMATS:
            raise ValueError(f"keep must be one of {RECORDS_KEPT}, format one of {RECORDS_FORMATS}")
        self.path, self.keep, self.format = Path(path), keep, format
        self.secrets = tuple(s for s in secrets if s)  # masked ("***") in every record's error message
        self.written = 0  # records handed to the writer
        self._encoder = msgspec.json.Encoder()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._columns: Any = None
        self._file: Any = None
        if format == "parquet":
            from .columnar import ParquetColumns

            self._columns = ParquetColumns(self.path, PARQUET_ROW_GROUP)
        else:
            self._file = open(self.path, "wb", buffering=0)  # noqa: SIM115 (closed by close())
        self._closed = False
        self._error: OSError | None = None
        self._kernel = True  # copy_lines by sendfile, until it is refused once
        self._thread = threading.Thread(target=self._drain, name="loadgen-records", daemon=True)
        self._thread.start()

    def write(self, batch: Batch) -> None:
        if self.keep == "none":
            return
        if self.keep == "errors":
            batch = [r for r in batch if r.error_kind is not None]
        if not batch:
            return
        for secret in self.secrets:
            batch = [_redacted(r, secret) for r in batch]
        self.written += len(batch)
        self._queue.put(self._columns.table(batch) if self._columns is not None else encode_lines(self._encoder.encode_lines, batch))

    def write_samples(self, samples: Sequence[ProbeSample]) -> None:
        """Append probe samples (a probe sink's: run.json's facts' companion, probe.jsonl) as JSON
        lines, at once: one scrape's samples are one write, so a killed run keeps every scrape."""
        if samples:
            self._queue.put(encode_lines(self._encoder.encode_lines, samples))

    @property
    def takes_lines(self) -> bool:
        """Whether `write_lines` can take records already encoded: it writes them as they are."""
        return self.format == "jsonl" and self.keep in ("all", "none") and not self.secrets

    def write_lines(self, lines: bytes, records: int) -> None:
        """Append `records` records already encoded as JSON lines, as `write` encodes them (only when
        `takes_lines`: a worker process's bytes, run/workers/parent.py)."""
        if self.keep == "none" or not lines:
            return
        self.written += records
        self._queue.put(lines)

    def copy_lines(self, fd: int, offset: int, length: int, records: int) -> None:
        """Append `length` bytes of the file open as `fd` from `offset` on: `records` records already
        encoded as JSON lines (as `write_lines`), copied by the kernel on the writer thread. `fd`
        must stay open, and those bytes unchanged, until the copy is done: `close_after(fd)`."""
        if self.keep == "none" or not length:
            return
        self.written += records
        self._queue.put((fd, offset, length))

    def close_after(self, fd: int) -> None:
        """Close `fd` once every copy queued from it is done (at once when the sink is closed)."""
        if self._closed:
            os.close(fd)
        else:
            self._queue.put((fd, None, 0))

    def _drain(self) -> None:
        while (data := self._queue.get()) is not None:
            if isinstance(data, tuple):
                fd, offset, length = data
                try:
                    if offset is None:
                        os.close(fd)
                    elif self._error is None:
                        self._kernel = _copy_range(fd, offset, length, self._file.fileno(), self._kernel)
                except OSError as exc:
                    self._error = exc
                continue
            if self._error is not None:
                continue
            try:
                if not isinstance(data, bytes):
                    self._columns.add(data)
                    continue
                view = memoryview(data)
                while view:
                    view = view[self._file.write(view):]
            except OSError as exc:
                self._error = exc

    def close(self) -> None:
        """Write what is queued, sync and close; raises the writer's OSError if one came."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join()
        try:
            if self._columns is not None and self._error is None:
                self._columns.close()
            if self._file is not None:
                os.fsync(self._file.fileno())
        except OSError as exc:
            self._error = self._error or exc
        finally:
            if self._file is not None:
                self._file.close()
        if self._error is not None:
            raise self._error


def _copy_range(source: int, offset: int, length: int, target: int, kernel: bool = True) -> bool:
    """Append bytes [offset, offset + length) of `source` at `target`'s position: in the kernel
    (sendfile) while `kernel`, else (and from the first refusal on: sendfile may not take two files
    on this system) read and written. Returns whether the kernel may still be asked."""
    while length:
        n = 0
        if kernel:
            try:
                n = os.sendfile(target, source, offset, length)
            except OSError:
                kernel = False  # a real fault (a full disk) is raised again by the write below
        if not kernel:
            data = os.pread(source, min(length, 1 << 20), offset)
            n = len(data)
            view = memoryview(data)
            while view:
                view = view[os.write(target, view):]
        if n == 0:
            raise OSError(errno.EIO, f"a worker's records file ended {length} bytes early")
        offset += n
        length -= n
    return kernel


def _redacted(r: RequestRecord, secret: str) -> RequestRecord:
    if r.error_message is not None and secret in r.error_message:
        return msgspec.structs.replace(r, error_message=r.error_message.replace(secret, "***"))
    return r


class LevelRecords:
    """A level's completed records on their way out; see the module docstring.

    Consumers are called with each batch, in order, on the thread that appends (the event loop).
    `watermark` gives the earliest send still in flight (for `LevelAggregate.settle`), or None.
    """

    def __init__(self, consumers: list[Callable[[Batch], None]], keep: bool = False,
                 encoded: RecordSink | None = None) -> None:
        self.consumers = consumers
        self.keep = keep
        # Where records already encoded may go instead (RecordSink.write_lines, copy_lines), when
        # nothing else reads them (the level's aggregate then gets their figures another way); else None.
        self.encoded = encoded
        self.kept: Batch = []
        self._batch: Batch = []
        self._flushed_ns = now_ns()

    def append(self, record: RequestRecord) -> None:
        batch = self._batch
        batch.append(record)
        if len(batch) >= BATCH_RECORDS or record.complete_ns - self._flushed_ns >= BATCH_SECONDS * 1e9:
            self.flush()

    def extend(self, records: Batch) -> None:
        """Append `records` at once (a worker process's, run/workers/parent.py)."""
        if not records:
            return
        self._batch.extend(records[:-1])
        self.append(records[-1])  # flushes as one more record would

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        self._flushed_ns = now_ns()
        if not batch:
            return
        if self.keep:
            self.kept.extend(batch)
        for consume in self.consumers:
            consume(batch)

    def __iter__(self) -> Iterator[RequestRecord]:
        """The records kept in memory (keep=True), then the batch not yet flushed."""
        yield from self.kept
        yield from self._batch

    def __len__(self) -> int:
        return len(self.kept) + len(self._batch)
