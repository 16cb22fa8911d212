"""`loadgen ab` against simulators: interleaved runs on disk, the gate's verdict, bad input, Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from contextlib import ExitStack

import pytest

from loadgen.core.errors import EXIT_NOT_ENFORCED
from servers import LOADGEN, SimProcess, sim_profile

SWEEP = ("--", "--concurrency", "1,2", "--n-predict", "8", "--requests", "8", "--warmup", "0")


@pytest.fixture(scope="module")
def sims(tmp_path_factory):
    """Two simulated servers: one, and the same throttled (decode steps six times as long)."""
    tmp = tmp_path_factory.mktemp("ab-profiles")
    with ExitStack() as stack:
        urls = {}
        for name, step_ms in (("fast", 5.0), ("slow", 30.0)):
            profile = sim_profile(tmp / f"{name}.toml", name, step_ms, alias="ab-sim")
            urls[name] = stack.enter_context(SimProcess("--profile", str(profile), "--slots", "2")).url
        yield urls


def ab(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, "ab", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_an_a_a_is_not_failed_and_says_what_it_could_not_enforce_with_runs_interleaved_on_disk(sims, tmp_path):
    proc = ab("--baseline-url", sims["fast"], "--candidate-url", sims["fast"], "--repeat", "2",
              "--output", tmp_path / "ab", *SWEEP)
    # 2+2 runs without a floor: one degree of freedom, too few to say what they detect (two pairs
    # that happened to differ alike once read as no noise and passed)
    assert proc.returncode == EXIT_NOT_ENFORCED, proc.stdout + proc.stderr
    headline = proc.stdout.splitlines()[-1]
    assert headline.startswith("gate: not enforced (8 checks on 2 levels over 2+2 interleaved runs, ")
    assert ("6 of 8 checks not enforced: throughput, latency p50, latency p99 of unknown power at concurrency 1, 2 "
            "(2+2 runs give one degree of freedom)") in headline
    starts = {side: [json.loads((tmp_path / "ab" / side / f"0{i}" / "run.json").read_text())["started_utc"]
                     for i in (1, 2)] for side in ("baseline", "candidate")}
    order = sorted((t, side) for side, ts in starts.items() for t in ts)
    assert [side for _, side in order] == ["baseline", "candidate", "candidate", "baseline"]  # counterbalanced
    assert "2+2 interleaved runs" in proc.stdout
    calibrated = subprocess.run([*LOADGEN, "calibrate", str(tmp_path / "ab")], capture_output=True, text=True,
                                timeout=120)
    assert calibrated.returncode == 0 and (tmp_path / "ab" / "noise.json").is_file(), calibrated.stderr


def test_calibrate_refuses_an_a_b_folder_naming_the_field_and_the_runs(sims, tmp_path):
    proc = ab("--baseline-url", sims["fast"], "--candidate-url", sims["slow"], "--repeat", "2", "--no-gate",
              "--output", tmp_path / "ab", *SWEEP)
    assert proc.returncode == 0, proc.stderr
    calibrated = subprocess.run([*LOADGEN, "calibrate", str(tmp_path / "ab")], capture_output=True, text=True,
                                timeout=120)
    assert calibrated.returncode == 2 and calibrated.stderr.count("\n") == 1, calibrated.stderr
    assert (f"not runs of one configuration: server's url is {sims['fast']} in baseline/01, {sims['slow']} in "
            "candidate/01; ") in calibrated.stderr
    assert not (tmp_path / "ab" / "noise.json").exists()


def test_a_throttled_candidate_fails(sims, tmp_path):
    # 4 pairs: the paired test then has 3 degrees of freedom, and each check is tested at 99.17%
    # (6 checks), so |t| must pass ~6. A baseline level lasts under a second: at load average 11
    # on 2 cores one stalled baseline run (97 instead of ~250 tok/s) spread the pairs' log-ratios
    # to sd 0.29 around a mean of -0.77 (steps 3x as long), t = 5.3: 5 of 8 checks inconclusive
    # and once no regression at all (exit 3). Steps 6x as long put the mean near -1.5 (t ~10 at
    # that spread); 4 of 4 such runs at load 8-11 failed it on 5 or 6 checks.
    proc = ab("--baseline-url", sims["fast"], "--candidate-url", sims["slow"], "--repeat", "4",
              "--output", tmp_path / "ab", *SWEEP[:-4], "--requests", "16", "--warmup", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert any(line.startswith(("REGRESSION: throughput server at concurrency",
                                "REGRESSION: latency_p50 server at concurrency"))
               for line in proc.stdout.splitlines()), proc.stdout


@pytest.mark.parametrize("args, message", [
    (("--", "--url", "http://127.0.0.1:1"), "--url is set by ab itself"),
    (("--", "--output=x"), "--output is set by ab itself"),
    (("--max-throughput-drop", "lots"), "expected a share like 5% or 0.05"),
])
def test_bad_input_is_one_line_and_exit_2(sims, tmp_path, args, message):
    proc = ab("--baseline-url", sims["fast"], "--candidate-url", sims["fast"], "--output", tmp_path / "ab", *args)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_a_bad_sweep_option_is_refused_before_the_first_run(sims, tmp_path):
    proc = ab("--baseline-url", sims["fast"], "--candidate-url", sims["fast"], "--output", tmp_path / "ab",
              "--", "--concurrency", "zero")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "sweep options" in proc.stderr and "--concurrency" in proc.stderr and "run 1/" not in proc.stderr


def tokens_predicted(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return next(float(line.split()[1]) for line in text.splitlines()
                if line.startswith("llamacpp:tokens_predicted_total "))


def test_ctrl_c_stops_the_sweep_under_way_keeps_the_runs_and_exits_130(sims, tmp_path):
    out = tmp_path / "ab"
    proc = subprocess.Popen([*LOADGEN, "ab", "--baseline-url", sims["fast"], "--candidate-url", sims["fast"],
                             "--output", str(out), "--", "--concurrency", "2", "--requests", "100000",
                             "--n-predict", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        start, deadline = tokens_predicted(sims["fast"]), time.monotonic() + 60
        while tokens_predicted(sims["fast"]) < start + 5 * 8:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads((out / "baseline" / "01" / "run.json").read_text())
    assert doc["interrupted"] is True and doc["targets"][0]["levels"][0]["requests_ok"] >= 1
    assert not (out / "candidate").exists()  # no further run started
    time.sleep(0.5)
    before = tokens_predicted(sims["fast"])
    time.sleep(0.5)
    assert tokens_predicted(sims["fast"]) == before  # no sweep left sending


def test_candidate_args_reach_only_the_candidates_runs_and_are_kept_for_resume(sims, tmp_path):
    """One server with and without a request feature: --candidate-args gives the candidate's sweeps
    a JSON schema (docs/request-features.md); the baseline's bodies stay plain."""
    schema = '{"type": "object"}'
    proc = ab("--baseline-url", sims["fast"], "--candidate-url", sims["fast"], "--repeat", "2", "--no-gate",
              "--candidate-args", f"--json-schema '{schema}'", "--output", tmp_path / "ab",
              "--", "--concurrency", "1", "--n-predict", "8", "--requests", "4", "--warmup", "0", "--no-ignore-eos")
    assert proc.returncode == 0, proc.stderr
    for i in (1, 2):
        base = json.loads((tmp_path / "ab" / "baseline" / f"0{i}" / "run.json").read_text())["config"]
        cand = json.loads((tmp_path / "ab" / "candidate" / f"0{i}" / "run.json").read_text())["config"]
        assert "json_schema" not in base and cand["json_schema"] == {"type": "object"}
        assert base["ignore_eos"] is cand["ignore_eos"] is False
    saved = json.loads((tmp_path / "ab" / "ab.json").read_text())
    assert saved["candidate_args"] == ["--json-schema", schema]
    again = ab("--resume", tmp_path / "ab", "--candidate-args", "--tools 3")
    assert again.returncode == 2 and "leave out --baseline-args and --candidate-args" in again.stderr


@pytest.mark.parametrize("text, args, says", [
    ("", (), None),
    ("--lora-mix 0:1,1:1", ("--lora-mix", "0:1,1:1"), None),
    ("--prompt 'two words'", ("--prompt", "two words"), None),
    ("--output elsewhere", None, "--candidate-args: --output is set by ab itself"),
    ("--url=http://x", None, "--candidate-args: --url is set by ab itself"),
    ("--prompt 'unclosed", None, "--candidate-args: No closing quotation"),
])
def test_one_sides_own_sweep_options_are_split_as_a_shell_splits_them(text, args, says):
    from loadgen.cli.ab import side_args
    from loadgen.core.errors import InputError

    if says is None:
        assert side_args(text, "--candidate-args") == args
        return
    with pytest.raises(InputError, match=says):
        side_args(text, "--candidate-args")
