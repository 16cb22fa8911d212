"""--percentiles: the chosen percentiles of TTFT, latency, TPOT and ITL per level, from the level's
histograms, in run.json, the tables and the exports; the fixed figures stay as they were."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from loadgen.analysis.aggregate import summarize_level
from loadgen.analysis.metric_defs import parse_percentiles, percentile_label
from loadgen.core.records import RequestRecord
from loadgen.results.reader import load_run_dict
from servers import SimThread


@pytest.mark.parametrize("text, expected", [
    ("50,95,99.9", (50.0, 95.0, 99.9)),
    ("99.9, 50", (50.0, 99.9)),  # sorted, spaces allowed
    ("p95,p99", (95.0, 99.0)),  # the p of a table header is allowed
    ("100", (100.0,)),
])
def test_percentiles_parse(text, expected):
    assert parse_percentiles(text) == expected


@pytest.mark.parametrize("text, message", [
    ("", "expected percentiles"),
    ("50,,99", "expected percentiles"),
    ("0", "out of range"),
    ("100.1", "out of range"),
    ("nan", "out of range"),
    ("ninety", "not a percentile"),
    ("95,95", "given twice"),
])
def test_bad_percentiles_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_percentiles(text)


@pytest.mark.parametrize("q, label", [(50, "p50"), (99.9, "p99.9"), (99.99, "p99.99"), (100, "p100")])
def test_percentile_label(q, label):
    assert percentile_label(q) == label


def test_level_percentiles_are_those_of_its_values():
    # latencies 1..1000 ms, one per request: the q-th percentile is the value at rank ceil(q% × n)
    rs = [RequestRecord(target="t", level=1, worker=0, seq=i, salt="", send_ns=0, complete_ns=ms * 1_000_000,
                        predicted_n=4) for i, ms in enumerate(range(1, 1001))]
    plain = summarize_level(1, rs)
    chosen = summarize_level(1, rs, percentiles=(50, 95, 99.9))
    assert plain.percentiles is None and "percentiles" not in plain.to_dict()
    latency = chosen.percentiles["latency_ms"]
    values = np.arange(1, 1001, dtype=float)
    for q in (50, 95, 99.9):
        expected = np.percentile(values, q, method="inverted_cdf")
        assert latency[percentile_label(q)] == pytest.approx(expected, rel=1e-3)  # HdrHistogram: 3 digits
    assert latency["p50"] == chosen.latency_ms.p50  # the same histogram as the fixed figures
    assert chosen.latency_ms == plain.latency_ms  # which stay as they were
    assert set(chosen.percentiles) == {"latency_ms"}  # no stream: no TTFT, TPOT or ITL


def test_sweep_keeps_the_chosen_percentiles_in_run_json_tables_and_exports(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "6",
                                    "--n-predict", "6", "--warmup", "0", "--stream", "--percentiles", "50,95,99.9",
                                    "--format", "json", "--output", out)
    assert code == 0, err
    doc = json.loads((out / "run.json").read_text())
    assert doc["config"]["percentiles"] == [50, 95, 99.9]
    for lv in doc["targets"][0]["levels"]:
        assert set(lv["percentiles"]) == {"ttft_ms", "latency_ms", "tpot_ms", "itl_ms"}
        for key, at in lv["percentiles"].items():
            assert list(at) == ["p50", "p95", "p99.9"]
            assert at["p50"] == lv[key]["p50"] and at["p50"] <= at["p95"] <= at["p99.9"] <= lv[key]["max"] * 1.001
    tables = {t["title"].split(":")[0]: t for t in json.loads(stdout)["tables"]}
    sweep = next(t for t in json.loads(stdout)["tables"] if "p95" in t["columns"])
    assert "max" not in sweep["columns"] and "p99.9" in sweep["columns"]
    detail = tables["latency detail (ms)"]
    assert {"TTFT ms p99.9", "TPOT ms p95", "ITL ms p99.9", "E2E ms p95"} <= set(detail["columns"])
    load_run_dict(out)  # the contract still reads it

    code, _, err = loadgen("export", out, "--format", "csv", "--output", tmp_path / "csv")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "csv" / "levels.csv").open()))
    first = doc["targets"][0]["levels"][0]
    assert float(rows[0]["ttft_ms_p99.9"]) == first["percentiles"]["ttft_ms"]["p99.9"]
    assert float(rows[0]["latency_ms_p99"]) == first["latency_ms"]["p99"]  # the fixed columns stay
    code, _, err = loadgen("export", out, "--format", "json", "--output", tmp_path / "json")
    assert code == 0, err
    levels = json.loads((tmp_path / "json" / "levels.json").read_text())["targets"][0]["levels"]
    assert levels[1]["percentiles"] == doc["targets"][0]["levels"][1]["percentiles"]


def test_analyze_computes_the_chosen_percentiles_from_the_records_as_the_sweep_kept_them(loadgen, tmp_path):
    import copy

    from loadgen.results.percentiles import with_percentiles
    from loadgen.results.reader import load_records

    out, bare = tmp_path / "run", tmp_path / "bare"
    with SimThread(slots=2) as sim:
        for where, more in ((out, ("--percentiles", "90,99.9")), (bare, ("--records", "errors"))):
            code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "6",
                                   "--n-predict", "6", "--warmup", "0", "--stream", *more, "--output", where)
            assert code == 0, err
    doc = load_run_dict(out)
    again = with_percentiles(copy.deepcopy(doc), load_records(out), (90, 99.9))
    assert [lv["percentiles"] for lv in again["targets"][0]["levels"]] == \
        [lv["percentiles"] for lv in doc["targets"][0]["levels"]]  # streamed and from the records: the same
    code, stdout, err = loadgen("analyze", out, "--percentiles", "95", "--format", "json")
    assert code == 0, err
    columns = json.loads(stdout)["tables"][0]["columns"]
    assert "p95" in columns and "p90" not in columns and "max" not in columns
    code, _, err = loadgen("analyze", bare, "--percentiles", "95")
    assert code == 2 and "--records errors" in err, err


def test_a_bad_percentile_is_one_line(loadgen, tmp_path):
    code, _, err = loadgen("sweep", "--ports", "9", "--percentiles", "50,101", "--output", tmp_path / "run")
    assert code == 2 and "out of range" in err, err
