"""`loadgen ab` as a new user meets it (issue 39): both sides checked before the first run, the reason
a run stopped shown, and --resume after an interruption. Expected outputs written first."""

from __future__ import annotations

import json
import subprocess

import pytest

from loadgen.cli.ab import stop_reason
from servers import LOADGEN, SimProcess, refused_port

SWEEP = ("--", "--concurrency", "1", "--n-predict", "4", "--requests", "2", "--warmup", "0")


@pytest.fixture(scope="module")
def sim():
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "0.05") as s:
        yield s.url


def ab(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, "ab", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_a_bad_candidate_url_is_refused_before_the_first_run(sim, tmp_path):
    """Before: refused only after the baseline's whole first run."""
    proc = ab("--baseline-url", sim, "--candidate-url", "notaurl", "--output", tmp_path / "ab", *SWEEP)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--candidate-url" in proc.stderr and "run 1/" not in proc.stderr
    assert not (tmp_path / "ab" / "baseline").exists()


def test_a_dead_candidate_is_refused_before_the_first_run(sim, tmp_path):
    with refused_port() as port:
        proc = ab("--baseline-url", sim, "--candidate-url", f"http://127.0.0.1:{port}", "--output", tmp_path / "ab",
                  *SWEEP)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "candidate" in proc.stderr and "connection refused" in proc.stderr
    assert "run 1/" not in proc.stderr


# a stopped sweep's stderr -> the line ab shows as the reason (written before the function)
STOPS = [
    ("connection refused by 127.0.0.1:9 (is the server running?); skipping this target\nresults: /x\n",
     "connection refused by 127.0.0.1:9 (is the server running?); skipping this target"),
    ("loadgen: error: Invalid value for '--concurrency'\n", "loadgen: error: Invalid value for '--concurrency'"),
    ("level 1 ...\nthe server stopped answering: 5 timeouts in a row\nresults: /x\nreport: loadgen report /x\n",
     "the server stopped answering: 5 timeouts in a row"),
    ("results: /x\n", "(no message)"),
    ("", "(no message)"),
]


@pytest.mark.parametrize("stderr, expected", STOPS)
def test_the_reason_a_run_stopped(stderr, expected):
    assert stop_reason(stderr) == expected


def test_resume_runs_only_what_is_left(sim, tmp_path):
    out = tmp_path / "ab"
    proc = ab("--baseline-url", sim, "--candidate-url", sim, "--repeat", "2", "--no-gate", "--output", out, *SWEEP)
    assert proc.returncode == 0, proc.stderr
    first = json.loads((out / "baseline" / "01" / "run.json").read_text())["started_utc"]
    doc = json.loads((out / "candidate" / "02" / "run.json").read_text())
    (out / "candidate" / "02" / "run.json").write_text(json.dumps({**doc, "complete": False}))  # as if Ctrl-C
    proc = ab("--resume", out, "--no-gate")
    assert proc.returncode == 0, proc.stderr
    assert "candidate run 2/2 ..." in proc.stderr
    assert "baseline run 1/2 ... kept from before" in proc.stderr
    assert json.loads((out / "baseline" / "01" / "run.json").read_text())["started_utc"] == first
    assert json.loads((out / "candidate" / "02" / "run.json").read_text())["complete"] is True
    proc = ab("--resume", out, "--candidate-url", sim)
    assert proc.returncode == 2 and "--resume" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
