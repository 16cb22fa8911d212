"""kill -9 in a run's first level (issue 46, item 6): probe.jsonl holds the scrapes up to the kill
(the probe streams to disk as it scrapes) and run.json the server's facts (written before the first
level), so `analyze` names the server's slots and its /metrics instead of advising --metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from loadgen.core.records import ProbeSample
from servers import LOADGEN, SimProcess


def _non_empty(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def test_a_run_killed_in_its_first_level_keeps_the_probe_and_the_server_facts(tmp_path):
    out = tmp_path / "run"
    # a request takes ~0.8 s on this simulator: the first level is still running when it is killed
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "10") as sim:
        proc = subprocess.Popen([*LOADGEN, "sweep", "--url", sim.url, "--concurrency", "2", "--requests", "100000",
                                 "--n-predict", "32", "--warmup", "1", "--output", str(out)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (_non_empty(out / "probe.jsonl") and _non_empty(out / "requests.jsonl")):
                assert proc.poll() is None, "the sweep ended before it was killed"
                assert time.monotonic() < deadline, "probe.jsonl or requests.jsonl stayed empty in the first level"
                time.sleep(0.02)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    samples = [ProbeSample.from_dict(json.loads(line)) for line in (out / "probe.jsonl").read_text().splitlines()]
    assert samples and all(s.level == 2 and s.busy_slots is not None for s in samples)
    server = json.loads((out / "run.json").read_text())["targets"][0]["server"]
    assert server["metrics_enabled"] is True and server["total_slots"] == 2  # before: no targets at all
    shown = subprocess.run([*LOADGEN, "analyze", str(out)], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "it has 2 slots" in text
    assert "--metrics" not in text and "/metrics unavailable" not in text
