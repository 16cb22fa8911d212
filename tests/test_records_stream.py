"""Records stream to disk as requests complete: a long run holds no more memory at its end than
halfway, a killed run leaves a readable file, `--records` chooses what is written."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import msgspec
import pytest

from loadgen.core.records import ServerOutcome, make_record
from loadgen.core.recordsink import RecordSink
from loadgen.results.reader import load_records, load_run_dict
from servers import LOADGEN, InstantServer

REQUESTS = 200_000
# What the second half's 100k records would weigh if they were kept in memory: ~900 B each as
# RequestRecords (measured: 658 MB peak for 741k requests before records streamed). The run may
# grow by a small share of that (allocator arenas, the writer's queue), not by the records.
KEPT_SECOND_HALF_MB = 90
ALLOWED_GROWTH_MB = KEPT_SECOND_HALF_MB / 3


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _tree_rss_mb(pid: int) -> float | None:
    """RSS of a process and its children (a sweep's worker processes), in MB."""
    rss = _rss_mb(pid)
    if rss is None:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return rss + sum(_rss_mb(int(c)) or 0.0 for c in children)


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-workers"])
def test_a_long_run_holds_flat_memory_and_writes_one_record_per_request(tmp_path, workers):
    """With --workers 2 the worker processes count too: each streams its records to the parent and
    keeps only its histograms (a worker once kept every record of its level until the level ended)."""
    out = tmp_path / "run"
    with InstantServer() as server:
        proc = subprocess.Popen([*LOADGEN, "sweep", "--url", server.url, "--concurrency", "64", "--requests",
                                 str(REQUESTS), "--warmup", "0", "--no-histograms", "--output", str(out),
                                 "--workers", str(workers)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        samples: list[tuple[int, float]] = []  # (requests the server has seen, loadgen's RSS in MB)
        while proc.poll() is None:  # sample until the run ends by itself
            rss, seen = _tree_rss_mb(proc.pid), server.count()
            if rss is not None:
                samples.append((seen, rss))
            time.sleep(0.05)
        stdout, stderr = proc.communicate()
        seen = server.count()
    assert proc.returncode == 0, stderr
    halfway = [rss for n, rss in samples if n >= REQUESTS // 2]
    assert len(halfway) >= 3, samples  # the second half was watched
    growth = max(halfway) - halfway[0]
    print(f"RSS at half {halfway[0]:.1f} MB, peak after {max(halfway):.1f} MB (+{growth:.1f} MB)")
    assert growth < ALLOWED_GROWTH_MB, (halfway[0], max(halfway))
    records = load_records(out)
    assert seen == REQUESTS and len(records) == REQUESTS
    assert len({r.seq for r in records}) == REQUESTS and all(r.ok for r in records)
    level = load_run_dict(out)["targets"][0]["levels"][0]
    assert level["requests_ok"] == REQUESTS and level["concurrency_reached"] == 64


def test_a_killed_run_reads_up_to_its_last_complete_record_and_analyze_says_incomplete(tmp_path):
    out = tmp_path / "run"
    with InstantServer() as server:
        proc = subprocess.Popen([*LOADGEN, "sweep", "--url", server.url, "--concurrency", "8", "--duration", "120",
                                 "--warmup", "0", "--output", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            path = out / "requests.jsonl"
            while proc.poll() is None and not (path.exists() and path.stat().st_size > 200_000):
                time.sleep(0.05)
            assert proc.poll() is None, "the sweep ended before it was killed"
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
    assert load_run_dict(out)["complete"] is False
    records = load_records(out)
    assert len(records) > 100
    whole = path.read_bytes()
    assert len(records) == whole.count(b"\n")  # every complete line, nothing of a line cut short
    done = subprocess.run([*LOADGEN, "analyze", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "incomplete" in done.stdout and "Traceback" not in done.stderr
    # the level it was killed in is summarised from its records, never dropped
    assert "c=8: incomplete, the run was killed during this level" in done.stderr


def test_a_record_cut_short_by_a_kill_is_left_out_of_an_unfinished_run(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"schema": "loadgen.run", "schema_version": 2,
                                                   "targets": [], "complete": False}))
    line = json.dumps(make_record("t", 1, 0, 0, "s", 1, 2, 200, ServerOutcome()).to_dict())
    (tmp_path / "requests.jsonl").write_text(line + "\n" + line + "\n" + line[:30])
    assert len(load_records(tmp_path)) == 2


def _record(seq: int, error: str | None):
    return make_record("t", 1, 0, seq, "s", 1, 2, 200 if error is None else 500, ServerOutcome(error_kind=error))


@pytest.mark.parametrize("keep,written", [
    ("all", [0, 1, 2, 3]),
    ("errors", [1, 3]),
    ("none", []),
])
def test_records_option_chooses_what_the_sink_writes(tmp_path, keep, written):
    sink = RecordSink(tmp_path / "requests.jsonl", keep=keep)
    sink.write([_record(0, None), _record(1, "http_500")])
    sink.write([_record(2, None), _record(3, "timeout")])
    sink.close()
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in lines] == written


def test_records_none_still_summarises_every_request(tmp_path):
    out = tmp_path / "run"
    with InstantServer() as server:
        done = subprocess.run([*LOADGEN, "sweep", "--url", server.url, "--concurrency", "4", "--requests", "500",
                               "--warmup", "0", "--records", "none", "--output", str(out)],
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (out / "requests.jsonl").read_bytes() == b""
    level = load_run_dict(out)["targets"][0]["levels"][0]
    assert level["requests_ok"] == 500 and level["latency_ms"]["count"] == 500
    assert (out / "histograms" / "instant-c4-latency.hgrm").is_file()


@pytest.mark.parametrize("kernel", ["sendfile", "refused", "refused-midway"])
def test_records_copied_from_a_workers_file_land_in_order_with_the_others(tmp_path, monkeypatch, kernel):
    records = [_record(i, None) for i in range(30)]
    lines = [msgspec.json.Encoder().encode_lines([r]) for r in records]
    worker_file = tmp_path / "worker.jsonl"
    worker_file.write_bytes(b"".join(lines[10:30]))
    real_sendfile, calls = os.sendfile, []

    def sendfile(out_fd, in_fd, offset, count):
        # refused (as where sendfile takes only a socket), or after copying a little first
        calls.append(count)
        if kernel == "refused" or len(calls) > 1:
            raise OSError(errno.ENOTSOCK, "not a socket")
        return real_sendfile(out_fd, in_fd, offset, min(count, 7))

    if kernel != "sendfile":
        monkeypatch.setattr(os, "sendfile", sendfile)
    sink = RecordSink(tmp_path / "requests.jsonl")
    open_before = len(os.listdir("/proc/self/fd"))
    fd = os.open(worker_file, os.O_RDONLY)
    sink.write(records[:5])
    first = sum(map(len, lines[10:20]))
    sink.copy_lines(fd, 0, first, 10)  # records 10-19
    sink.write_lines(b"".join(lines[5:10]), 5)
    sink.copy_lines(fd, first, os.path.getsize(worker_file) - first, 10)  # records 20-29
    sink.copy_lines(fd, first, 0, 0)  # nothing
    sink.close_after(fd)
    sink.close()
    assert [r.seq for r in load_records(tmp_path)] == [*range(5), *range(10, 20), *range(5, 10), *range(20, 30)]
    assert sink.written == 30
    assert len(os.listdir("/proc/self/fd")) == open_before - 1  # the worker's file closed, and its own
    assert len(calls) == {"sendfile": 0, "refused": 1, "refused-midway": 2}[kernel]  # asked no more once refused
