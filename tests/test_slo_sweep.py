"""`loadgen sweep --slo`: each level's attainment and goodput in run.json, the table and --format
json, equal to the rule (analysis/slo.py) applied to the saved records; refusals in one line."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.slo import judge_level, parse_slo
from loadgen.core.records import RequestRecord
from loadgen.results.reader import load_run_dict
from servers import SimThread


def test_sweep_judges_every_level_as_its_records_say(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,4", "--requests", "8",
                                    "--n-predict", "8", "--warmup", "0", "--stream", "--slo", "ttft=40ms,e2e=2s",
                                    "--attainment", "0.75", "--format", "json", "--output", out)
    assert code == 0, err
    doc = json.loads((out / "run.json").read_text())
    assert doc["config"]["slo"] == {"targets_ms": {"ttft": 40.0, "e2e": 2000.0}, "attainment": 0.75}
    records = [RequestRecord.from_dict(json.loads(line)) for line in (out / "requests.jsonl").read_text().splitlines()]
    slo = parse_slo("ttft=40ms,e2e=2s", 0.75)
    for lv in doc["targets"][0]["levels"]:
        expected = judge_level(slo, [r for r in records if r.level == lv["level"]])
        got = lv["slo"]
        assert (got["judged"], got["good"], got["passed"]) == (expected.judged, expected.good, expected.passed)
        assert got["goodput_req_s"] == pytest.approx(got["good"] / lv["wall_s"])
    printed = json.loads(stdout)
    table = printed["tables"][0]
    assert "attain" in table["columns"] and "goodput req/s" in table["columns"]
    assert any(line.startswith("SLO: ttft≤40 ms, e2e≤2 s") for line in printed["notes"])
    load_run_dict(out)  # the file still reads back


@pytest.mark.parametrize("args, message", [
    (("--slo", "ttft=500ms"), "add --stream"),
    (("--slo", "tpot=50ms,e2e=8s"), "tpot is measured on streamed responses only"),
    (("--slo", "latency=5s"), "unknown target 'latency'"),
    (("--slo", "e2e=5s", "--attainment", "2"), "not a share"),
    (("--attainment", "0.5"), "--attainment applies to --slo"),
    (("--slo", "e2e=5s", "--workers", "2"), "without --workers"),
    (("--slo", "e2e=5s", "--ray"), "without --workers (or --ray)"),
])
def test_an_slo_that_cannot_be_judged_is_refused(loadgen, tmp_path, args, message):
    code, _, err = loadgen("sweep", "--ports", "9", *args, "--output", tmp_path / "run")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_level_table_has_a_row_per_run_of_a_repeated_level_with_its_attainment():
    from loadgen.analysis.aggregate import summarize_level
    from loadgen.analysis.slo import SloTally
    from loadgen.output.layout import _plain, filled_rows
    from loadgen.output.tables import sweep_table

    slo = parse_slo("e2e=1s")

    def level(c, e2e_ms):
        rs = [RequestRecord(target="t", level=c, worker=0, seq=i, salt="", send_ns=0, complete_ns=int(ms * 1e6),
                            predicted_n=10, prompt_n=20) for i, ms in enumerate(e2e_ms)]
        summary = summarize_level(c, rs).to_dict()
        summary["slo"] = SloTally.of(slo, rs).result(summary["wall_s"]).to_dict()
        return summary

    # c=3 run twice (as capacity repeats a level near the line): 2 of 2, then 1 of 2 within the target
    doc = {"kind": "sweep", "config": {"mode": "concurrency"},
           "targets": [{"label": "t", "levels": [level(1, [100, 200]), level(3, [900, 950]), level(3, [900, 1200])]}]}
    grid = sweep_table(doc)
    rows = [[_plain(c) for c in row] for row in filled_rows(grid)]
    names = [c.name for c in grid.columns]
    at = names.index("attain")
    assert [(r[0], r[at]) for r in rows] == [(1, "100%"), (3, "100%"), (3, "50%")]
    assert [r[names.index("in tok")] for r in rows] == [40, 40, 40]


@pytest.mark.parametrize("command", [("sweep",), ("capacity", "--stream"), ("soak", "--duration", "5")])
@pytest.mark.parametrize("slo", ["e2e=1e400", "e2e=1e306m"])
def test_an_infinite_target_is_refused_up_front_by_every_command_taking_slo(loadgen, tmp_path, command, slo):
    """Port 9 has no server: a refusal that came after the run would say so instead."""
    code, _, err = loadgen(*command, "--ports", "9", "--slo", slo, "--output", tmp_path / "run")
    assert code == 2 and f"'{slo}' is not a finite time" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()
