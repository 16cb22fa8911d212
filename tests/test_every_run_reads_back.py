"""loadgen reads every run it writes: each kind of run (closed loop, open loop with and without a
knee, streamed, prefill, depth, soak, interrupted, target down) goes through every reader
(analyze, report HTML and Markdown, every export format, compare, gate). A reader may decline a
kind it does not handle, in one line (compare reads sweeps); it never calls loadgen's own file
damaged and never shows a traceback.
"""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request

import pytest

from loadgen.core.errors import EXIT_NOT_ENFORCED
from loadgen.results.reader import load_run_dict
from servers import LOADGEN, SimProcess, free_port

SWEEPS = ("closed", "open_knee", "open_calm", "stream", "interrupted", "down")
MODES = ("prefill", "depth", "soak")


def tokens_predicted(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("llamacpp:tokens_predicted_total "))


def loadgen(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds")
    with SimProcess("--profile", "smoke", "--slots", "4") as sim:
        url = sim.url
        common = ("--url", url, "--n-predict", "16", "--warmup", "0")
        argv = {
            "closed": ("sweep", *common, "--concurrency", "1,2", "--requests", "8"),
            # 4 slots of the smoke model finish ~70 requests/s: 400/s is far past the knee
            "open_knee": ("sweep", *common, "--rate", "20,400", "--requests", "60"),
            "open_calm": ("sweep", *common, "--rate", "5,10", "--requests", "10"),
            "stream": ("sweep", *common, "--stream", "--concurrency", "2", "--requests", "6"),
            "down": ("sweep", "--ports", str(free_port()), "--concurrency", "1", "--requests", "2",
                     "--wait-ready", "0"),
            "prefill": ("prefill", "--url", url, "--prompt-tokens", "64,128", "--repeat", "2", "--warmup", "0"),
            "depth": ("depth", "--url", url, "--depths", "0,256", "--n-predict", "8", "--repeat", "2"),
            "soak": ("soak", *common, "--concurrency", "2", "--duration", "3s", "--checkpoint-interval", "1s"),
        }
        out = {}
        for kind, args in argv.items():
            out[kind] = root / kind
            proc = loadgen(*args, "--output", str(out[kind]))
            assert proc.returncode in (0, 1), (kind, proc.stderr)
            assert (out[kind] / "run.json").exists(), (kind, proc.stderr)
        out["interrupted"] = root / "interrupted"
        proc = subprocess.Popen([*LOADGEN, "sweep", *common, "--concurrency", "2", "--requests", "100000",
                                 "--output", str(out["interrupted"])],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start, deadline = tokens_predicted(url), time.monotonic() + 60
        while tokens_predicted(url) < start + 5 * 16:  # five requests done: the level is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
        yield out


def read(loadgen, *args) -> tuple[int, str, str]:
    """A reader run in-process (cli.main, the real error path)."""
    code, out, err = loadgen(*args)
    assert "Traceback" not in out + err, out + err
    assert "damaged" not in out + err, err
    return code, out, err


def test_the_runs_are_what_they_claim(runs):
    assert load_run_dict(runs["open_knee"])["targets"][0]["verdict"]["saturated_at"] is not None
    assert load_run_dict(runs["open_calm"])["targets"][0]["verdict"]["saturated_at"] is None
    assert load_run_dict(runs["interrupted"])["interrupted"] is True
    assert load_run_dict(runs["down"])["targets"][0]["error"]


@pytest.mark.parametrize("kind", SWEEPS + MODES)
def test_analyze_and_report_read_every_kind(runs, tmp_path, loadgen, kind):
    for args in (("analyze", runs[kind]), ("report", runs[kind], "--format", "markdown")):
        code, _, err = read(loadgen, *args)
        assert code == 0, err
    code, out, err = read(loadgen, "report", runs[kind], "--output", tmp_path / "r.html")
    if kind in MODES and kind != "soak":  # the report draws sweeps and soaks: refused in one line that says what shows the run
        assert code == 2 and len(err.strip().splitlines()) == 1 and "loadgen analyze" in err, err
        assert not (tmp_path / "r.html").exists()
    else:
        assert code == 0, err
        assert (tmp_path / "r.html").is_file()


@pytest.mark.parametrize("fmt", ["hgrm", "hlog", "csv", "json"])
@pytest.mark.parametrize("kind", SWEEPS + MODES)
def test_export_reads_every_kind(runs, tmp_path, loadgen, kind, fmt):
    code, _, err = read(loadgen, "export", runs[kind], "--format", fmt, "--output", tmp_path)
    assert code == 0 or (code == 2 and len(err.strip().splitlines()) == 1), err


@pytest.mark.parametrize("command", ["compare", "gate"])
@pytest.mark.parametrize("kind", SWEEPS + MODES)
def test_compare_and_gate_read_every_kind(runs, loadgen, kind, command):
    code, _, err = read(loadgen, command, runs[kind], runs[kind])
    if kind in ("closed", "open_knee", "open_calm", "stream", "interrupted"):
        # a run against itself: nothing changed; one run a side lets the gate enforce nothing (exit 3)
        assert code == (EXIT_NOT_ENFORCED if command == "gate" else 0), err
    else:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
