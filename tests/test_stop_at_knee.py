"""`sweep --stop-at-knee` on a 2-slot simulator: the ladder ends one level past the knee (or a level
that clearly misses the SLO), and the run reads as the shorter, complete sweep it was."""

from __future__ import annotations

import json

import pytest

from servers import CAPACITY_SIM, SimProcess

LADDER = ("--concurrency", "1,2,3,4,6,8", "--n-predict", "16", "--warmup", "1", "--stream", "--stop-at-knee")


@pytest.fixture(scope="module")
def sim2(tmp_path_factory):
    profile = tmp_path_factory.mktemp("profile") / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    with SimProcess("--profile", str(profile), "--slots", "2") as sim:
        yield sim


def test_the_ladder_ends_one_level_past_the_knee(loadgen, tmp_path, sim2):
    code, _, err = loadgen("sweep", "--url", sim2.url, *LADDER, "--output", tmp_path / "run")
    assert code == 0, err
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    target = doc["targets"][0]
    ran = [lv["level"] for lv in target["levels"]]
    knee = target["verdict"]["saturated_at"]
    assert knee is not None and ran[-1] > knee and len(ran) < 6 and ran == [1, 2, 3, 4, 6, 8][:len(ran)], (ran, knee)
    assert doc["complete"] and doc["config"]["concurrency"] == ran
    assert "--stop-at-knee: saturated at" in err


def test_a_level_that_clearly_misses_the_slo_ends_the_ladder(loadgen, tmp_path, sim2):
    # at c=3 one request in three waits a whole answer (~300 ms) for one of the 2 slots
    code, _, err = loadgen("sweep", "--url", sim2.url, *LADDER, "--slo", "ttft=150ms", "--output", tmp_path / "run")
    assert code == 0, err
    levels = json.loads((tmp_path / "run" / "run.json").read_text())["targets"][0]["levels"]
    assert levels[-1]["slo"]["passed"] is False or "saturated at" in err
    assert len(levels) < 6


def test_stop_at_knee_takes_one_target(loadgen, tmp_path):
    code, _, err = loadgen("sweep", "--ports", "9,10", "--stop-at-knee", "--output", tmp_path / "run")
    assert code == 2 and "one target" in err
