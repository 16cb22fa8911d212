"""`loadgen capacity` on the simulator, whose slot count is known: its answer equals the highest
passing level of an exhaustive sweep of the same server and SLO, with fewer requests; every probed
level is a normal sweep level that analyze reads; budgets and refusals."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from servers import CAPACITY_SIM, LOADGEN, SimProcess, terminate

# A decode step of 20 ms: 16 tokens take ~0.3 s, so a request that waits for a slot has a TTFT of a
# whole answer (~300 ms), one that does not a few ms: with 3 slots, c=3 meets ttft<=150ms, c=4 not.
COMMON = ("--stream", "--slo", "ttft=150ms", "--n-predict", "16", "--warmup", "1")


@pytest.fixture(scope="module")
def sim3(tmp_path_factory):
    profile = tmp_path_factory.mktemp("profile") / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    with SimProcess("--profile", str(profile), "--slots", "3") as sim:
        yield sim


def test_capacity_equals_the_exhaustive_sweep_with_fewer_requests(loadgen, tmp_path, sim3):
    code, out, err = loadgen("capacity", "--url", sim3.url, *COMMON, "--max-concurrency", "16", "--format", "json",
                             "--output", tmp_path / "cap")
    assert code == 0, err
    result = json.loads(out)["capacity"]
    assert set(result) >= {"feasible_max", "infeasible_min", "binding", "inconclusive", "levels", "verdict"}
    assert result["feasible_max"] == 3 and result["infeasible_min"] == 4, result["verdict"]
    assert result["binding"] == "ttft" and result["shape"] == "cliff"
    assert result["verdict"].startswith("serves 3 concurrent users within ttft≤150 ms for 90% of requests; at 4 TTFT")
    assert "its 3 slots are full" in result["verdict"]
    assert json.loads((tmp_path / "cap" / "capacity.json").read_text())["capacity"] == result

    levels = ",".join(str(c) for c in range(1, 2 * result["feasible_max"] + 1))
    code, _, err = loadgen("sweep", "--url", sim3.url, *COMMON, "--concurrency", levels, "--output", tmp_path / "all")
    assert code == 0, err
    swept = json.loads((tmp_path / "all" / "run.json").read_text())["targets"][0]["levels"]
    assert max(lv["level"] for lv in swept if lv["slo"]["passed"]) == result["feasible_max"]
    exhaustive = sum(lv["requests_ok"] + lv["requests_failed"] for lv in swept)
    assert result["requests"] < exhaustive

    # every probed level is a sweep level of a complete run that analyze reads
    doc = json.loads((tmp_path / "cap" / "run.json").read_text())
    assert doc["complete"] and doc["config"]["concurrency"] == [lv["level"] for lv in result["levels"]]
    code, out, err = loadgen("analyze", tmp_path / "cap")
    assert code == 0 and "attain" in out, err


def test_a_request_budget_stops_the_search_with_the_answer_so_far(loadgen, tmp_path, sim3):
    # c=1 and c=2 take 8 requests each; c=4 would take 16 more than the 20 allowed
    code, out, err = loadgen("capacity", "--url", sim3.url, *COMMON, "--budget", "20", "--format", "json",
                             "--output", tmp_path / "cap")
    assert code == 0, err
    result = json.loads(out)["capacity"]
    assert [lv["level"] for lv in result["levels"]] == [1, 2]
    assert result["feasible_max"] == 2 and result["infeasible_min"] is None
    assert result["ended"].startswith("budget: 16 requests sent")
    assert "no level failed up to 2 (the search stopped: budget: 16 requests sent" in result["verdict"]


@pytest.mark.parametrize("args, message", [
    (("--ports", "9"), "give the latency targets with --slo"),
    (("--ports", "9,10", "--slo", "e2e=1s"), "one server at a time"),
    (("--ports", "9", "--slo", "ttft=1s"), "add --stream"),
    (("--ports", "9", "--slo", "e2e=1s", "--budget", "lots"), "--budget 'lots'"),
    (("--ports", "9", "--slo", "e2e=1s", "--max-concurrency", "2.5"), "whole number"),
    (("--ports", "9", "--slo", "e2e=1s", "--requests", "4", "--max-concurrency", "8"), "fewer than"),
])
def test_capacity_refuses_in_one_line(loadgen, tmp_path, args, message):
    code, _, err = loadgen("capacity", *args, "--output", tmp_path / "x")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not Path(tmp_path / "x").exists()


def _kill_after_first_level(sim: SimProcess, run_json: Path, stop: threading.Event) -> None:
    """SIGKILL the simulator once run.json holds a finished level (the search goes on to the next)."""
    while not stop.wait(0.02):
        try:
            levels = json.loads(run_json.read_text())["targets"][0]["levels"]
        except (OSError, ValueError, KeyError, IndexError):
            continue
        if levels:
            sim.proc.kill()
            return


def test_a_server_killed_mid_search_is_named_with_the_level_it_died_at(loadgen, tmp_path):
    profile = tmp_path / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    out, stop = tmp_path / "cap", threading.Event()
    with SimProcess("--profile", str(profile), "--slots", "3") as sim:
        killer = threading.Thread(target=_kill_after_first_level, args=(sim, out / "run.json", stop))
        killer.start()
        try:
            code, stdout, err = loadgen("capacity", "--url", sim.url, *COMMON, "--format", "json", "--output", out)
        finally:
            stop.set()
            killer.join()
    assert code == 1, err
    assert "Traceback" not in err
    result = json.loads(stdout)["capacity"]
    assert re.fullmatch(r"the server died or stopped answering at c=\d+: .+", result["ended"]), result["ended"]
    assert "None" not in result["verdict"] and result["ended"] in result["verdict"], result["verdict"]
    assert json.loads((out / "capacity.json").read_text())["capacity"]["ended"] == result["ended"]


def test_ctrl_c_mid_search_is_named_in_capacity_json(tmp_path):
    profile = tmp_path / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    out = tmp_path / "cap"
    with SimProcess("--profile", str(profile), "--slots", "3") as sim:
        proc = subprocess.Popen([*LOADGEN, "capacity", "--url", sim.url, *COMMON, "--output", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not _levels(out) and time.monotonic() < deadline:
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            stdout, err = proc.communicate(timeout=60)
        finally:
            terminate(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    ended = json.loads((out / "capacity.json").read_text())["capacity"]["ended"]
    assert re.fullmatch(r"interrupted \(SIGINT, Ctrl-C\) (at|after) c=\d+", ended), ended
    assert f"search ended: {ended}" in err


def _levels(out: Path) -> list:
    try:
        return json.loads((out / "run.json").read_text())["targets"][0]["levels"]
    except (OSError, ValueError, KeyError, IndexError):
        return []


def test_analyze_rebuilds_the_answer_when_capacity_json_is_missing(loadgen, tmp_path, sim3):
    out = tmp_path / "cap"
    code, stdout, err = loadgen("capacity", "--url", sim3.url, *COMMON, "--max-concurrency", "8", "--format", "json",
                                "--output", out)
    assert code == 0, err
    verdict = json.loads(stdout)["capacity"]["verdict"]
    assert verdict.startswith("serves 3 concurrent users"), verdict
    code, printed, err = loadgen("analyze", out)
    assert code == 0 and verdict in printed.splitlines(), printed  # capacity.json's answer, as it said it
    code, printed, err = loadgen("report", out, "--format", "markdown")  # the report says it first
    assert code == 0 and f"- {verdict}" in printed.splitlines(), printed
    (out / "capacity.json").unlink()
    code, printed, err = loadgen("analyze", out)
    assert code == 0, err
    rebuilt = f"{verdict} (rebuilt from run.json: capacity.json is missing or unreadable)"
    assert rebuilt in printed.splitlines(), printed
    code, printed, err = loadgen("report", out, "--format", "markdown")
    assert code == 0 and f"- {rebuilt}" in printed.splitlines(), printed
    # run.json names the command, and holds the search's settings (schema 4) that the rebuild read
    doc = json.loads((out / "run.json").read_text())
    assert (doc["kind"], doc["schema_version"]) == ("capacity", 4)
    assert doc["config"]["capacity"] == {"by": "concurrency", "max_level": 8, "start": 1, "repeat": 3, "noise": 0.1,
                                         "budget_requests": None, "budget_s": None, "hold_s": 120.0,
                                         "at_least": False}
    # a run written before schema 4 said "sweep" and kept the settings only in its command line
    doc.update(kind="sweep", schema_version=3)
    del doc["config"]["capacity"]
    (out / "run.json").write_text(json.dumps(doc))
    code, printed, err = loadgen("analyze", out)
    assert code == 0 and rebuilt in printed.splitlines(), printed


def test_capacity_takes_the_sweeps_workload_drawn_lengths_included(loadgen, tmp_path, sim3):
    # "how many users at these prompt and answer lengths within this TTFT": capacity takes sweep's
    # --prompt-tokens and --n-predict distributions (it took neither); every request has its drawn
    # length on the server, and the answer is still the slot count (a prefill of ~100 tokens is fast).
    code, out, err = loadgen("capacity", "--url", sim3.url, "--stream", "--slo", "ttft=150ms", "--warmup", "1",
                             "--prompt-tokens", "uniform:64:128", "--n-predict", "normal:16,2,min=12,max=20",
                             "--max-concurrency", "8", "--format", "json", "--output", tmp_path / "cap")
    assert code == 0, err
    assert json.loads(out)["capacity"]["feasible_max"] == 3
    config = json.loads((tmp_path / "cap" / "run.json").read_text())["config"]
    assert str(config["workload"]["prompt_tokens"]).startswith("uniform"), config["workload"]
    records = [json.loads(line) for line in (tmp_path / "cap" / "requests.jsonl").read_text().splitlines()]
    assert records and all(64 <= r["prompt_n"] + (r.get("cache_n") or 0) <= 128 for r in records)
    assert all(12 <= r["predicted_n"] <= 20 for r in records)
    assert len({r["prompt_n"] + (r.get("cache_n") or 0) for r in records}) > 5  # drawn, not one length
