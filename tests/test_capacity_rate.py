"""`loadgen capacity --by rate` on a simulator whose service rate is known (issue 46).

One slot, a 20 ms decode step (CAPACITY_SIM) at a quarter of its time (`--time-scale 0.25`), 64
tokens an answer: a request takes ~0.33 s, so the server finishes ~3 requests a second. Written
before the run: at `--start 4` (above that) the server does not keep up, and although 10 requests
at 4 req/s all finish within the 2.5 s target (the backlog has no time to grow that far), the rate
must fail; the search then halves below its start, 2 req/s passes (a slot idle a third of the time),
and the answer lies in [2, 4). Every run of a level draws its own arrival schedule.
"""

from __future__ import annotations

import json

import pytest

from servers import CAPACITY_SIM, SimProcess


@pytest.fixture
def one_slot(tmp_path):
    profile = tmp_path / "capsim.toml"
    profile.write_text(CAPACITY_SIM)
    with SimProcess("--profile", str(profile), "--slots", "1", "--time-scale", "0.25") as sim:
        yield sim


def test_a_rate_the_server_cannot_keep_up_with_fails_and_the_search_halves_below_its_start(loadgen, tmp_path,
                                                                                             one_slot):
    code, out, err = loadgen("capacity", "--url", one_slot.url, "--by", "rate", "--start", "4", "--max-concurrency",
                             "8", "--slo", "e2e=2.5s", "--n-predict", "64", "--requests", "10", "--warmup", "1",
                             "--format", "json", "--output", tmp_path / "cap")
    assert code == 0, err
    result = json.loads(out)["capacity"]
    levels = result["levels"]
    # the start was run first and failed because the server fell behind, not by a latency miss: its
    # requests met the target ("passed" is --slo's judgement), the search's decision is a failure
    assert levels[0]["level"] == 4 and levels[0]["passed"] and levels[0]["decision"] == "fail", levels[0]
    assert levels[0]["open_loop"] in ("overloaded", "at_limit"), levels[0]
    assert "did not keep up" in result["why"], result["why"]
    # halved below the start: an answer under the starting rate, never one the server fell behind at
    assert result["feasible_max"] is not None and 2 <= result["feasible_max"] < 4, result["verdict"]
    assert all(lv["open_loop"] not in ("overloaded", "at_limit") for lv in levels if lv["decision"] == "pass"), levels
    assert result["verdict"].startswith(f"serves {result['feasible_max']:g} req/s"), result["verdict"]
    # every run of a level on its own arrival schedule
    by_level: dict[float, list[int]] = {}
    for lv in levels:
        by_level.setdefault(lv["level"], []).append(lv["arrival_seed"])
    assert all(len(set(seeds)) == len(seeds) for seeds in by_level.values()), by_level


@pytest.mark.parametrize("args,says", [
    # the cap is the highest rate it may run: a start above it is refused, not run (it ran 1 req/s)
    (("--max-concurrency", "0.001"), "--start 1 is above --max-concurrency 0.001"),
    (("--start", "0"), "--start 0: give a rate above 0 req/s"),
    (("--max-concurrency", "inf"), "must be a number above 0"),
])
def test_a_rate_search_outside_its_cap_is_refused_before_any_request(loadgen, tmp_path, args, says):
    code, _, err = loadgen("capacity", "--url", "http://127.0.0.1:9", "--by", "rate", "--slo", "e2e=1s", *args,
                           "--output", tmp_path / "cap")
    assert code == 2 and says in err, err
    assert not (tmp_path / "cap").exists()


def test_hold_without_by_rate_is_refused(loadgen, tmp_path):
    code, _, err = loadgen("capacity", "--url", "http://127.0.0.1:9", "--slo", "e2e=1s", "--hold", "30s",
                           "--output", tmp_path / "cap")
    assert code == 2 and "--hold" in err and "--by rate" in err, err
