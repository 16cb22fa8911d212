"""`loadgen capacity` on the simulator, whose slot count is known: its answer equals the highest
passing level of an exhaustive sweep of the same server and SLO, with fewer requests; every probed
level is a normal sweep level that analyze reads; budgets and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servers import CAPACITY_SIM, SimProcess

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
    assert "no level failed up to 2 (the search stopped (budget" in result["verdict"]


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
