"""A level is what it says it is: its concurrency is reached, or refused, and run.json records the
concurrency actually reached (issue 16, item 5)."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.aggregate import summarize_level
from loadgen.analysis.metrics import concurrency_reached
from loadgen.core.records import RequestRecord
from loadgen.core.rundoc import LevelSummary
from loadgen.output.tables import reach_lines
from servers import SimThread

MS = 1_000_000


def rec(send_ms: float, complete_ms: float, seq: int = 0, error_kind: str | None = None) -> RequestRecord:
    return RequestRecord(target="t", level=8, worker=seq, seq=seq, salt=f"s{seq}", send_ns=int(send_ms * MS),
                         complete_ns=int(complete_ms * MS), status=200, error_kind=error_kind, predicted_n=4)


def test_concurrency_reached_is_the_peak_of_overlapping_requests():
    assert concurrency_reached([]) == 0
    assert concurrency_reached([rec(0, 10)]) == 1
    # three overlap at t=5..6; the fourth starts when the first ends (back to back: no overlap)
    assert concurrency_reached([rec(0, 10, 0), rec(2, 6, 1), rec(5, 20, 2), rec(10, 30, 3)]) == 3
    assert concurrency_reached([rec(0, 10, 0), rec(10, 20, 1), rec(20, 30, 2)]) == 1
    # a cancelled request was in flight too
    assert concurrency_reached([rec(0, 10, 0), rec(1, 2, 1, error_kind="cancelled")]) == 2


def test_a_level_summary_carries_it_and_an_old_file_without_it_still_reads():
    summary = summarize_level(8, [rec(0, 10, 0), rec(1, 11, 1), rec(2, 12, 2)])
    assert summary.concurrency_reached == 3
    assert summary.to_dict()["concurrency_reached"] == 3
    old = {k: v for k, v in summary.to_dict().items() if k != "concurrency_reached"}
    import msgspec
    assert msgspec.convert(old, LevelSummary).concurrency_reached is None


def test_a_level_short_of_its_concurrency_is_warned_about():
    level = summarize_level(8, [rec(0, 10, 0), rec(1, 11, 1), rec(2, 12, 2)]).to_dict()
    doc = {"config": {"mode": "concurrency"}, "targets": [{"label": "sim", "levels": [level]}]}
    (line,) = reach_lines(doc)
    assert "sim at concurrency 8" in line and "at most 3 requests were in flight" in line
    full = summarize_level(3, [rec(0, 10, 0), rec(1, 11, 1), rec(2, 12, 2)]).to_dict()
    assert reach_lines({"config": {"mode": "concurrency"}, "targets": [{"label": "sim", "levels": [full]}]}) == []


@pytest.mark.parametrize("args, message", [
    (("--concurrency", "8", "--requests", "3"), "--requests 3 is fewer than concurrency 8"),
    (("--requests", "4"), "--requests 4 is fewer than concurrency 8"),  # the default ladder tops at 8
    (("--concurrency", "2", "--requests", "4", "--duration", "5"), "--requests"),
    (("--rate", "2", "--requests", "4", "--duration", "5"), "not both"),
])
def test_a_budget_that_cannot_fill_the_level_or_is_ambiguous_is_refused(loadgen, args, message, tmp_path):
    code, out, err = loadgen("sweep", "--ports", "9", *args, "--output", tmp_path / "run")
    assert code == 2, (out, err)
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_the_same_rules_hold_for_a_scenario_run_and_its_check(loadgen, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('mode = "sweep"\nports = [9]\nconcurrency = [8]\nrequests = 3\n')
    for extra in ((), ("--check",)):
        code, out, err = loadgen("run", scenario, *extra)
        assert code == 2, (extra, out, err)
        assert "fewer than concurrency 8" in err
    scenario.write_text('mode = "sweep"\nports = [9]\nrequests = 8\nduration = "5s"\n')
    code, _, err = loadgen("run", scenario, "--check")
    assert code == 2 and "not both" in err


def test_run_json_records_the_concurrency_each_level_reached(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=4) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,3", "--requests", "6",
                               "--n-predict", "8", "--warmup", "0", "--output", out)
    assert code == 0, err
    levels = json.loads((out / "run.json").read_text())["targets"][0]["levels"]
    assert [lv["concurrency_reached"] for lv in levels] == [1, 3]
    assert "in flight" not in err
