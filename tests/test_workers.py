"""`--workers N`: a sweep's levels shared over worker processes against the simulator, merged into a
run that reads like a one-process run; a worker killed mid-level; the open-loop schedule kept exact;
the workers' histograms added exactly; no worker outliving the parent."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hdrh.log import HistogramLogReader

from loadgen.core.errors import EXIT_NOT_ENFORCED, ConfigError
from loadgen.core.records import RequestRecord
from loadgen.output.exporters import metric_histogram
from loadgen.run.schedule import arrival_offsets_ns
from loadgen.run.workers.merge import add_histograms
from loadgen.run.workers.policy import auto_workers, local_workers
from oracles import same_buckets
from servers import LOADGEN, SimProcess, in_process_cli, sweep

needs_pyarrow = pytest.mark.skipif(importlib.util.find_spec("pyarrow") is None,
                                   reason="pip install 'loadgen[parquet]' (the dev extra has it)")


@pytest.mark.parametrize("urls, cores, expected", [
    (["http://127.0.0.1:8080"], 2, 1),  # a local server keeps a core
    (["http://10.0.0.5:8000"], 2, 2),
    (["http://localhost:1", "http://10.0.0.5:8000"], 8, 7),
    (["http://[::1]:8080"], 1, 1),  # never fewer than one
    (["https://gpu-box.example:443"], 16, 16),
])
def test_workers_auto(urls: list[str], cores: int, expected: int) -> None:
    assert auto_workers(urls, cores) == expected


@pytest.mark.parametrize("asked, most_in_flight, cores, expected", [
    (2, 64, 2, 2),
    (4, 1, 2, 1),  # a level of one request in flight: one process; three would idle
    (4, 3, 2, 3),
    (99999, 2, 2, 2),  # capped by the load before the cores are counted
    (8, None, 2, 8),  # an open loop without --max-in-flight: no cap from the load
    (9, None, 2, None),  # more than 4 a core: refused
    (99999, 4096, 2, None),
    (5, 64, 1, None),
    (3, 0, 2, 1),
])
def test_local_workers_never_idle_nor_crowd_the_cores(asked, most_in_flight, cores, expected) -> None:
    if expected is None:
        with pytest.raises(ConfigError, match=f"--workers {asked}: more than 4 processes a core"):
            local_workers(asked, most_in_flight, cores)
    else:
        assert local_workers(asked, most_in_flight, cores) == expected


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "'0' is not a number of processes (1 or more) or auto"),
    (["--workers", "100000", "--concurrency", "4096"], "--workers 100000: more than 4 processes a core"),
    (["--workers", "many"], "'many' is not a number of processes (1 or more) or auto"),
    (["--workers", "2", "--parallel-targets"], "with --parallel-targets run one loadgen per target instead"),
])
def test_bad_workers_flags_are_refused_in_one_line(args: list[str], message: str, monkeypatch, capsys) -> None:
    code, _, err = in_process_cli(monkeypatch, capsys)("sweep", "--ports", "1,2", *args)
    assert code == 2 and message in err


def _records(run_dir: Path) -> list[RequestRecord]:
    return [RequestRecord.from_dict(json.loads(line)) for line in (run_dir / "requests.jsonl").open()]


def _levels(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text())["targets"][0]["levels"]


@pytest.fixture(scope="module")
def sim():
    with SimProcess("--profile", "smoke", "--slots", "4", "--time-scale", "0.05") as server:
        yield server


@pytest.fixture(scope="module")
def two_runs(sim, tmp_path_factory) -> tuple[Path, Path]:
    """The same closed-loop sweep by one process and by two worker processes."""
    out = tmp_path_factory.mktemp("workers")
    args = ["--url", sim.url, "--concurrency", "1,3", "--requests", "12", "--n-predict", "8", "--force"]
    one = sweep(*args, "--output", str(out / "one"))
    two = sweep(*args, "--output", str(out / "two"), "--workers", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    return out / "one", out / "two"


def test_a_two_worker_sweep_has_every_request_of_a_one_process_sweep(two_runs) -> None:
    one, two = two_runs
    for a, b in zip(_levels(one), _levels(two)):
        assert (a["level"], a["requests_ok"], a["requests_failed"]) == (b["level"], b["requests_ok"], b["requests_failed"])
        assert b["stopped_reason"] is None and "workers" not in a
    records = _records(two)
    for level, _processes, concurrencies in ((1, 1, [1]), (3, 2, [2, 1])):
        rs = [r for r in records if r.level == level]
        assert sorted(r.seq for r in rs) == list(range(12))  # numbered as the level's, none twice
        assert sorted({r.worker for r in rs}) == list(range(level))  # the level's workers, numbered level-wide
        workers = next(lv for lv in _levels(two) if lv["level"] == level)["workers"]
        assert [w["concurrency"] for w in workers] == concurrencies
        assert sum(w["records"] for w in workers) == 12
        assert all(w["client_cpu_fraction"] is not None and w["pid"] for w in workers)
    assert json.loads((two / "run.json").read_text())["config"]["workers"] == 2
    assert not (two / "workers").exists()  # the workers' own files go once every record is written


@pytest.mark.parametrize("records_format", ["jsonl", pytest.param("parquet", marks=needs_pyarrow)])
def test_a_merged_levels_figures_are_those_of_its_records(sim, tmp_path, records_format) -> None:
    """JSON lines: the parent passes the workers' bytes on and adds their figures (never reading a
    record); Parquet: it reads every record, as one process would. Either way run.json says what
    the records file holds: counts and percentiles exactly, means to the last digits (added in
    another order), and how many were in flight at once."""
    from loadgen.analysis.aggregate import LevelAggregate
    from loadgen.results.reader import load_records

    out = tmp_path / "run"
    done = sweep("--url", sim.url, "--concurrency", "5", "--duration", "1.5", "--n-predict", "40", "--stream",
                 "--workers", "2", "--records-format", records_format, "--output", str(out))
    assert done.returncode == 0, done.stderr
    (level,) = _levels(out)
    records = load_records(out)
    whole = LevelAggregate.of(records).summary(5)
    assert level["requests_ok"] == whole.requests_ok > 20
    assert (level["requests_failed"], level["concurrency_reached"]) == (whole.requests_failed, 5)
    assert level["output_tokens"] == whole.output_tokens
    for name in ("latency_ms", "ttft_ms", "tpot_ms", "itl_ms", "queue_wait_ms"):
        got, expected = level[name], getattr(whole, name)
        assert [got[k] for k in ("count", "p50", "p90", "p99", "max")] == \
            [expected.count, expected.p50, expected.p90, expected.p99, expected.max], name
        assert got["mean"] == pytest.approx(expected.mean, rel=1e-9), name


def test_a_level_over_workers_reaches_its_whole_concurrency(tmp_path) -> None:
    """The parent reads each worker's records in batches, later than they were sent: counting what
    was in flight must wait for all of them (settled as they came, a 2 s level at c=8 over two
    workers read "at most 7 requests were in flight" and warned of it).

    Its own simulator at full time scale: 100 tokens of 3.5 ms steps (~350 ms a request in a slot,
    ~700 ms with the wait for one), 28 requests in the level. The module's simulator (time scale
    0.05) made the same requests of 3,000 steps of 175 µs each, and under load (11 on 2 cores) it
    fell behind its own schedule: latency p50 812-1,668 ms instead of 700, and once only 16
    requests, failing `requests_ok > 16`; at 3.5 ms a step it kept it (28 requests, p50 689-699 ms,
    4 runs of 4)."""
    with SimProcess("--profile", "smoke", "--slots", "4") as sim:
        done = sweep("--url", sim.url, "--concurrency", "8", "--duration", "2", "--n-predict", "100", "--workers", "2",
                     "--output", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    (level,) = _levels(tmp_path / "run")
    figures = {k: level[k] for k in ("concurrency_reached", "requests_ok", "wall_s")}
    assert level["concurrency_reached"] == 8 and level["requests_ok"] > 16, figures
    assert "at most" not in done.stderr


def test_the_merged_run_reads_like_a_one_process_run(two_runs) -> None:
    one, two = two_runs
    for command in (["analyze", str(two)], ["report", str(two), "--format", "markdown"],
                    ["compare", str(one), str(two)], ["gate", str(one), str(two), "--max-latency-rise", "1000%",
                                                      "--max-throughput-drop", "90%"]):
        done = subprocess.run([*LOADGEN, *command], capture_output=True, text=True, timeout=300)
        # one run a side: the gate has nothing to test its limits with, and says so (exit 3)
        assert done.returncode == (EXIT_NOT_ENFORCED if command[0] == "gate" else 0), (command, done.stdout,
                                                                                       done.stderr)


def test_the_merged_hlog_is_the_sum_of_the_workers_and_of_all_records(two_runs) -> None:
    _, two = two_runs
    reader = HistogramLogReader(str(two / "histograms" / "workers.hlog"), metric_histogram([], "latency"))
    intervals: dict[str, list] = {}
    while (h := reader.get_next_interval_histogram()) is not None:
        intervals.setdefault(h.get_tag(), []).append(h)
    records = _records(two)
    for level in (1, 3):
        tag = f"smoke-sim/c{level}/latency"
        parts = [h for name, hs in intervals.items() if name.startswith(tag + "/worker") for h in hs]
        assert len(parts) == (1 if level == 1 else 2)
        [merged] = intervals[tag]
        assert same_buckets(merged, add_histograms(parts))
        assert same_buckets(merged, metric_histogram([r for r in records if r.level == level], "latency"))
        assert merged.get_total_count() == 12


def test_an_open_loop_rate_over_three_workers_keeps_the_one_process_schedule(sim, tmp_path) -> None:
    done = sweep("--url", sim.url, "--rate", "40", "--requests", "30", "--arrival", "poisson", "--arrival-seed", "3",
                 "--n-predict", "4", "--workers", "3", "--output", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    records = sorted(_records(tmp_path / "r"), key=lambda r: r.seq)
    assert [r.seq for r in records] == list(range(30))
    offsets = arrival_offsets_ns(40.0, requests=30, duration_s=None, arrival="poisson", burstiness=1.0, seed=3)
    start = records[0].intended_ns - offsets[0]
    assert [r.intended_ns - start for r in records] == list(offsets)  # to the nanosecond
    [level] = _levels(tmp_path / "r")
    assert [len(range(k, 30, 3)) for k in range(3)] == [w["records"] for w in level["workers"]]


def _worker_pids(parent: int) -> list[int]:
    """The parent's worker processes now. A thread or a child listed may be gone by the time it is
    read (a thread of a resolver's pool, a short-lived child): it is not a worker then."""
    pids = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "loadgen.run.workers.child" in cmdline:
                pids.append(int(pid))
    return sorted(pids)


def _wait_for(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _level_file(out: Path, k: int) -> Path:
    """Worker k's records file of the running level (`workers/worker-K-N.jsonl`, N numbering the
    level files of the run), or a path that does not exist yet."""
    return next(iter(sorted((out / "workers").glob(f"worker-{k}-*.jsonl"))), out / "workers" / "none")


@contextmanager
def _slow_two_worker_sweep(slots: int, out: Path, *budget: str, output: bool = True) -> Iterator[subprocess.Popen]:
    """`loadgen sweep --workers 2` against a simulator of `slots` slots at real time (about 0.1 s a
    request, so a level is still running when the test acts on it); killed if the test left it running."""
    with SimProcess("--profile", "smoke", "--slots", str(slots), "--time-scale", "1") as slow:
        pipe = subprocess.PIPE if output else subprocess.DEVNULL
        proc = subprocess.Popen([*LOADGEN, "sweep", "--url", slow.url, *budget, "--n-predict", "48", "--warmup", "0",
                                 "--workers", "2", "--output", str(out)], stdout=pipe, stderr=pipe, text=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_worker_killed_mid_level_keeps_its_records_and_its_requests_in_flight_are_lost(tmp_path) -> None:
    """Concurrency 4 on two processes (loop workers 0-1 and 2-3, requests 0-19 and 20-39): process 1
    killed mid-level has two requests in flight, which become records of kind "lost"; none of the
    requests it sent vanishes (its numbers run 20.. without a gap), and the level says it ran at
    concurrency 2 of 4 from then on."""
    out = tmp_path / "r"
    with _slow_two_worker_sweep(4, out, "--concurrency", "4", "--requests", "40") as proc:
        _wait_for(lambda: _lines(_level_file(out, 1)) >= 3, "worker 1's first records")
        file = _level_file(out, 1)
        pids = _wait_for(lambda: _worker_pids(proc.pid), "the worker processes")
        victim = next(p for p in pids if str(file) in _open_records_file(p))
        kept_before_kill = _lines(file)  # read before the kill: the level's end removes the file
        os.kill(victim, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "worker 1 killed by SIGKILL" in err
    [level] = _levels(out)
    assert level["stopped_reason"] == "worker 1 killed by SIGKILL"
    records = _records(out)
    first, second = ([r for r in records if r.worker in ws] for ws in ((0, 1), (2, 3)))
    assert len(first) == 20 and all(r.ok for r in first)  # the other process ran its whole share
    lost = [r for r in second if r.error_kind == "lost"]
    assert len(second) - len(lost) >= kept_before_kill  # every record the killed one had written is kept
    assert len(lost) == 2 and {r.worker for r in lost} == {2, 3}  # one in flight per loop worker
    assert {r.error_message for r in lost} == {"worker 1 died (killed by SIGKILL)"}
    assert sorted(r.seq for r in second) == list(range(20, 20 + len(second)))  # nothing it sent vanished
    assert max(r.seq for r in lost) == max(r.seq for r in second)  # the last it sent
    assert level["requests_lost"] == 2
    assert level["requests_ok"] + level["requests_failed"] + level["requests_lost"] == len(records)
    assert level["workers"][0]["records"] == 20 and level["workers"][1]["records"] is None
    death = level["workers"][1]
    assert death["lost"] == 2 and death["concurrency_after"] == 2 and 0 < death["died_at_s"] < level["wall_s"]
    assert (f"worker 1 died at {death['died_at_s']:.1f} s (killed by SIGKILL): the level ran at concurrency 2 of 4 "
            "from then on; 2 requests in flight recorded as lost") in err


def _open_records_file(pid: int) -> str:
    names = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            names.append(os.readlink(fd))
        except OSError:
            pass
    return " ".join(names)


def test_workers_do_not_outlive_their_parent(tmp_path) -> None:
    with _slow_two_worker_sweep(2, tmp_path / "r", "--concurrency", "2", "--duration", "600", output=False) as proc:
        pids = _wait_for(lambda: len(p := _worker_pids(proc.pid)) == 2 and p, "two worker processes")
        _wait_for(lambda: _lines(_level_file(tmp_path / "r", 0)) >= 1, "a first record")
        proc.kill()  # SIGKILL: no clean-up runs in the parent
        proc.wait()
        _wait_for(lambda: not any(Path(f"/proc/{p}").exists() and _state(p) != "Z" for p in pids),
                  "the workers to end", timeout=60)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def test_ctrl_c_stops_every_worker_and_keeps_their_records(tmp_path) -> None:
    out = tmp_path / "r"
    with _slow_two_worker_sweep(4, out, "--concurrency", "4", "--duration", "600") as proc:
        for k in (0, 1):
            _wait_for(lambda k=k: _lines(_level_file(out, k)) >= 2, f"worker {k}'s first records")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    [level] = _levels(out)
    assert level["stopped_reason"] == "interrupted"
    records = _records(out)
    assert Counter(r.error_kind for r in records)["cancelled"] == 4  # every request in flight, recorded
    assert [w["records"] for w in level["workers"]] == [sum(1 for r in records if r.worker in ws) for ws in ({0, 1}, {2, 3})]
    assert all(w["records"] >= 2 for w in level["workers"])


def test_a_soak_over_two_workers(sim, tmp_path) -> None:
    out = tmp_path / "s"
    done = subprocess.run([*LOADGEN, "soak", "--url", sim.url, "--concurrency", "3", "--duration", "2",
                           "--checkpoint-interval", "1s", "--n-predict", "8", "--workers", "2", "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    target = json.loads((out / "run.json").read_text())["targets"][0]
    [level] = target["levels"]
    assert [w["concurrency"] for w in level["workers"]] == [2, 1]
    records = _records(out)
    assert level["requests_ok"] == target["soak"]["requests_ok"] == len(records) == sum(
        w["records"] for w in level["workers"])
    assert sorted({r.worker for r in records}) == [0, 1, 2]


def test_a_soak_of_two_targets_over_workers_is_refused(sim, tmp_path) -> None:
    done = subprocess.run([*LOADGEN, "soak", "--url", sim.url, "--url", sim.url.replace("127.0.0.1", "localhost"), "--workers", "2",
                           "--output", str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "soak --workers loads one target; run one soak per target" in done.stderr
