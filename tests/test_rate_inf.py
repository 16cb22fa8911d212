"""--rate inf: every request of the level sent at once, stored in run.json (which has no infinity)
as "inf" and read back as math.inf by every reader; tables and messages say "rate inf"."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from loadgen.core.errors import ConfigError
from loadgen.core.records import RequestRecord, encode_lines, level_name, level_short
from loadgen.core.rundoc import json_safe, read_rates
from loadgen.results.reader import load_records, load_run_dict
from loadgen.run.config import parse_rate_list
from loadgen.run.schedule import arrival_offsets_ns, connections_ahead
from servers import SimThread


@pytest.mark.parametrize("text, expected", [
    ("inf", (math.inf,)),
    ("1,INF", (1.0, math.inf)),
    ("0.5, inf", (0.5, math.inf)),
])
def test_inf_is_a_rate(text, expected):
    assert parse_rate_list(text) == expected


@pytest.mark.parametrize("text, message", [
    ("inf,inf", "listed twice"),
    ("-inf", "not a positive rate"),
    ("infinity", "not a positive rate"),  # one spelling: inf
    ("nan", "not a positive rate"),
])
def test_other_infinities_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_rate_list(text)


def test_a_level_at_rate_inf_sends_every_request_at_offset_0():
    for arrival in ("constant", "poisson", "gamma"):
        offsets = arrival_offsets_ns(math.inf, requests=5, duration_s=None, arrival=arrival, burstiness=0.5)
        assert offsets.tolist() == [0, 0, 0, 0, 0] and offsets.dtype == np.int64
    with pytest.raises(ValueError, match="needs a request count"):
        arrival_offsets_ns(math.inf, requests=None, duration_s=10)


@pytest.mark.parametrize("cap, requests, expected", [(0, 8, 8), (3, 8, 3), (0, None, 1)])
def test_a_level_at_rate_inf_opens_a_connection_per_request(cap, requests, expected):
    assert connections_ahead(cap, math.inf, requests=requests, latency_s=1.0) == expected


def test_infinity_is_stored_as_inf_and_read_back_where_a_rate_is():
    doc = {"config": {"rates": [1.0, math.inf]}, "targets": [{"label": "inf", "levels": [
        {"level": math.inf, "rate": math.inf, "achieved_rate": 900.0}]}]}
    stored = json.loads(json.dumps(json_safe(doc), allow_nan=False))
    assert stored["config"]["rates"] == [1.0, "inf"] and stored["targets"][0]["levels"][0]["level"] == "inf"
    back = read_rates(stored)
    assert back == doc
    assert back["targets"][0]["label"] == "inf"  # a label is not a rate


def test_a_record_of_a_level_at_rate_inf_round_trips():
    import msgspec

    r = RequestRecord(target="t", level=math.inf, worker=0, seq=0, salt="", send_ns=1, complete_ns=2)
    line = encode_lines(msgspec.json.Encoder().encode_lines, [r])
    assert b'"level":"inf"' in line
    assert RequestRecord.from_dict(json.loads(line)) == r


def test_level_names():
    assert level_name(math.inf, True) == "rate inf" and level_short(math.inf, True) == "rate inf"
    assert level_short(2.0, True) == "2 req/s" and level_short(2, False) == "c=2"


def _strict(path):
    """run.json as a strict JSON reader sees it: no NaN or Infinity constants."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_sweep_at_rate_inf_sends_at_once_and_every_reader_reads_it(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--rate", "2,inf", "--requests", "6",
                                    "--n-predict", "4", "--warmup", "0", "--format", "json", "--output", out)
    assert code == 0, err
    assert "rate inf: 6 ok" in err  # the progress line
    stored = _strict(out / "run.json")
    assert stored["config"]["rates"] == [2.0, "inf"]
    level = stored["targets"][0]["levels"][1]
    assert (level["level"], level["rate"]) == ("inf", "inf")
    doc = load_run_dict(out)
    assert doc["targets"][0]["levels"][1]["level"] == math.inf
    records = [r for r in load_records(out) if r.level == math.inf]
    assert len(records) == 6 and len({r.intended_ns for r in records}) == 1  # all meant to leave at once
    rows = json.loads(stdout)["tables"][0]["rows"]
    assert [row[0] for row in rows] == [2, "inf"]

    code, printed, err = loadgen("compare", out, out, "--format", "json")
    assert code == 0, err
    assert {lv["concurrency"] for lv in json.loads(printed)["levels"]} == {2.0, "inf"}
    code, printed, err = loadgen("analyze", out)
    assert code == 0 and "inf" in printed, err
    assert "inf req/s" not in printed  # the verdict says "every request at once"
    code, _, err = loadgen("export", out, "--format", "json", "--output", tmp_path / "json")
    assert code == 0, err
    assert _strict(tmp_path / "json" / "levels.json")["targets"][0]["levels"][1]["level"] == "inf"
    code, _, err = loadgen("export", out, "--format", "hgrm", "--output", tmp_path / "hgrm")
    assert code == 0 and (tmp_path / "hgrm" / "smoke-sim-rinf-latency.hgrm").exists(), err


@pytest.mark.parametrize("args, message", [
    (("--rate", "inf"), "say how many with --requests"),
    (("--rate", "1,inf", "--duration", "10s"), "say how many with --requests"),
    (("--rate", "inf", "--requests", "8", "--workers", "2"), "without --workers"),
])
def test_rate_inf_without_a_count_is_refused(loadgen, tmp_path, args, message):
    code, _, err = loadgen("sweep", "--ports", "9", *args, "--output", tmp_path / "run")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
