"""The client's own limits are the client's (issue 46, item 5): an open loop whose requests may
all be in flight at once is refused up front when this process cannot open a file per connection
(one line naming `ulimit -n` and `--max-in-flight`, exit 2), and a connect that fails on the
client's open files or local ports during a run ends the level with that one line, never
"target down". Expected answers written before running."""

from __future__ import annotations

import errno
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from fake_transport import MockTransport
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.client.transport import connect_error
from loadgen.core import records
from loadgen.core.records import LevelRun
from loadgen.run.config import SweepConfig
from loadgen.run.engine import run_open_level
from servers import LOADGEN, SimProcess


def _with_fd_limit(limit: int, *args: str, script: str | None = None) -> subprocess.CompletedProcess:
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    command = [sys.executable, "-c", script, *args] if script else [*LOADGEN, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, preexec_fn=lower)


def _trace(path: Path, requests: int, rate: float) -> Path:
    path.write_text("".join(json.dumps({"timestamp": i * 1000 / rate, "input_length": 64, "output_length": 8}) + "\n"
                            for i in range(requests)))
    return path


def test_a_replay_that_may_hold_more_connections_than_files_is_refused_up_front(tmp_path):
    trace = _trace(tmp_path / "trace.jsonl", 3000, 1000)
    proc = _with_fd_limit(1024, "replay", str(trace), "--ports", "9", "--output", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr  # before: no check, "target down ... (Too many open files)"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadgen: error: 3000 requests may be in flight"), lines
    assert "ulimit -n 3064" in lines[0] and "--max-in-flight 960" in lines[0]
    assert "--workers" not in lines[0]  # replay has no --workers
    assert not (tmp_path / "r").exists()


# (arguments, peak in flight per process): the expected answers, written before the run
PEAKS = [
    (dict(rates=(1000.0,), requests_per_level=3000), 3000),
    (dict(rates=(1000.0,), requests_per_level=3000, max_in_flight=64), 64),
    (dict(rates=(100.0,), duration_s=30.0), 3000),  # a timed open loop: 100 req/s × 30 s
    (dict(rates=(100.0,), duration_s=30.0, requests_per_level=500), 500),
    (dict(rates=(2.0, 50.0)), 1000),  # no budget: 20 s worth of the top rate
    (dict(rates=(float("inf"),), requests_per_level=700), 700),
    (dict(rates=(1000.0,), requests_per_level=3000, workers=4), 750),
    (dict(concurrency=(1, 256)), 256),  # closed loop: its top concurrency, as before
]


@pytest.mark.parametrize("fields,peak", PEAKS)
def test_the_peak_in_flight_is_the_schedule_at_most_the_cap(fields, peak):
    fields = {"concurrency": (1,), **fields}
    assert SweepConfig(targets=(), generation=GenerationParams(prompt="p"), **fields).most_in_flight == peak


@pytest.mark.parametrize("args", [["--rate", "100", "--duration", "30"], ["--rate", "1000", "--requests", "3000"]])
def test_a_timed_or_counted_open_loop_is_refused_up_front_too(tmp_path, args):
    proc = _with_fd_limit(1024, "sweep", "--ports", "9", *args, "--output", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "3000 requests may be in flight" in lines[0]
    assert "ulimit -n" in lines[0] and "--max-in-flight" in lines[0] and "--workers" in lines[0]


def test_a_capped_open_loop_passes_the_check(tmp_path):
    proc = _with_fd_limit(1024, "sweep", "--ports", "9", "--rate", "1000", "--requests", "3000",
                          "--max-in-flight", "64", "--warmup", "0", "--output", str(tmp_path / "r"))
    assert proc.returncode == 1, proc.stderr  # it ran: port 9 refuses the connection
    assert "open files" not in proc.stderr and "connection refused" in proc.stdout + proc.stderr


@pytest.mark.parametrize("code,words", [(errno.EMFILE, "ran out of open files"), (errno.ENFILE, "ran out of open files"),
                                        (errno.EADDRNOTAVAIL, "ran out of local ports")])
def test_a_connect_on_the_clients_limit_is_the_clients(code, words):
    error = connect_error(OSError(code, "whatever the system says"), "h:1")
    assert error.client_limit and error.kind == records.CONNECT_ERROR
    assert words in error.message and "--max-in-flight" in error.message and "--workers" in error.message
    assert ("ulimit -n" in error.message) == (code != errno.EADDRNOTAVAIL)
    refused = connect_error(ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "h:1")
    assert not refused.client_limit and "is the server running?" in refused.message


def test_the_first_client_limit_ends_the_level_with_its_line():
    import asyncio

    def handler(req):
        raise connect_error(OSError(errno.EMFILE, "Too many open files"), "h:1")

    async def main() -> LevelRun:
        transport = MockTransport(handler)
        await transport.open("http://fake", 0, 30)
        level = LevelRun(target="fake", concurrency=0, rate=1000.0)
        backend = make_backend("llamacpp", GenerationParams(prompt="p", n_predict=8))
        await run_open_level(level, transport, backend, [i * 1_000_000 for i in range(10)])
        return level
    level = asyncio.run(main())
    assert level.stopped_reason is not None and "target down" not in level.stopped_reason
    assert level.stopped_reason.startswith("this client ran out of open files")
    assert len(level.records) == 1  # the level sends nothing more


# A real EMFILE mid-run: the up-front check is switched off in a child whose open files are few,
# and a rate inf level opens a connection per request until the process has none left.
_UNCHECKED = """
import sys, importlib
importlib.import_module("loadgen.cli.sweep").ensure_open_files = lambda *a, **k: None
sys.argv = ["loadgen", *sys.argv[1:]]
importlib.import_module("loadgen.cli.main").main()
"""


def test_running_out_of_open_files_mid_run_is_the_clients_line_not_target_down(tmp_path):
    with SimProcess("--profile", "smoke", "--slots", "1", "--time-scale", "20") as sim:
        proc = _with_fd_limit(128, "sweep", "--url", sim.url, "--rate", "inf", "--requests", "300", "--warmup", "0",
                              "--n-predict", "8", "--output", str(tmp_path / "r"), script=_UNCHECKED)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, proc.stderr[-3000:]  # before: numpy's lazy import died of EMFILE
    assert proc.returncode == 1
    assert "target down" not in text
    assert "this client ran out of open files (Too many open files)" in text and "ulimit -n" in text
