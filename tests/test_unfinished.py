"""A run killed outright (kill -9): the level it was running is summarised from its records by
`analyze` and `report`, marked incomplete, never dropped (results/unfinished.py).

The expected figures were written down before the tests were run.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from loadgen.analysis.aggregate import summarize_level
from loadgen.cli.analyze import analyze
from loadgen.cli.report import load_source
from loadgen.core.records import ServerOutcome, make_record
from loadgen.results.schema import SCHEMA, SCHEMA_VERSION

MS = 1_000_000


def _records(level: int, ok: int, failed: int = 0, lost: int = 0) -> list:
    kinds = [None] * ok + ["http_500"] * failed + ["lost"] * lost
    return [make_record("srv", level, i % level, i, "s", i * 10 * MS, i * 10 * MS + 50 * MS,
                        200 if kind is None else (500 if kind == "http_500" else None),
                        ServerOutcome(error_kind=kind, tokens_predicted=8 if kind is None else None))
            for i, kind in enumerate(kinds)]


def _run_dir(tmp: Path, levels: list[dict] | None, records: list, complete: bool) -> Path:
    doc = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "kind": "sweep", "complete": complete,
           "config": {"mode": "concurrency", "knee_gain": 0.1, "knee_latency": 0.5},
           "targets": [] if levels is None else [{"label": "srv", "url": "http://127.0.0.1:1", "server": None,
                                                  "error": None, "levels": levels, "verdict": None}]}
    (tmp / "run.json").write_text(json.dumps(doc))
    (tmp / "requests.jsonl").write_bytes(msgspec.json.Encoder().encode_lines(records))
    return tmp


C1 = _records(1, 4)
C4 = _records(4, 10, failed=1, lost=1)  # 12 records: 10 ok, 1 failed, 1 lost


@pytest.mark.parametrize("levels, complete, expected", [
    # killed during c=4: run.json has only c=1
    ([summarize_level(1, C1).to_dict()], False, {1: (4, 0, 0, None), 4: (10, 1, 1, "killed")}),
    # killed after a checkpoint saved c=4 in progress with 3 requests: the records' 12 replace it
    ([summarize_level(1, C1).to_dict(), summarize_level(4, C4[:3], "in progress").to_dict()], False,
     {1: (4, 0, 0, None), 4: (10, 1, 1, "killed")}),
    # killed before its first summary: every level from the records
    ([], False, {1: (4, 0, 0, "killed"), 4: (10, 1, 1, "killed")}),
    # killed before run.json named its target: the target too
    (None, False, {1: (4, 0, 0, "killed"), 4: (10, 1, 1, "killed")}),
    # a finished run is left as it is (a level it lacks was not run by it)
    ([summarize_level(1, C1).to_dict()], True, {1: (4, 0, 0, None)}),
])
def test_analyze_summarises_the_level_a_kill_left_unsummarised(tmp_path, levels, complete, expected) -> None:
    path = _run_dir(tmp_path, levels, C1 + C4, complete)
    result = CliRunner().invoke(analyze, [str(path), "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = load_source(str(path)).run
    got = {lv.level: (lv.requests_ok, lv.requests_failed, lv.requests_lost,
                      "killed" if lv.stopped_reason == "incomplete: the run was killed during this level"
                      else lv.stopped_reason) for lv in run.targets[0].levels}
    assert got == expected  # what `report` reads
    said = result.stderr if hasattr(result, "stderr") else result.output
    killed = [k for k, v in expected.items() if v[3] == "killed"]
    for key in killed:
        n = 4 if key == 1 else 12
        assert f"warning: srv c={key}: incomplete, the run was killed during this level; {n} requests recorded" in said
    if not killed:
        assert "killed during" not in said


def test_analyze_shows_the_killed_level_in_its_table(tmp_path) -> None:
    path = _run_dir(tmp_path, [summarize_level(1, C1).to_dict()], C1 + C4, complete=False)
    result = CliRunner().invoke(analyze, [str(path), "--format", "csv"], catch_exceptions=False)
    rows = [line.split(",") for line in result.stdout.splitlines()]
    assert ["4", "srv", "10/1"] in [row[:3] for row in rows], result.stdout  # C, target, ok/failed
