"""--trim: which records a level's figures leave out (a table of cases, answers written before the
first run), and a sweep that keeps every record but trims its figures, saying so."""

from __future__ import annotations

import csv
import json

import pytest

from loadgen.analysis.aggregate import summarize_level
from loadgen.analysis.trim import Trim, trim_level
from loadgen.core import records
from loadgen.core.records import RequestRecord
from loadgen.results.reader import load_run_dict
from servers import SimThread

S = 1_000_000_000


def _level(starts_s, length_s=1.0, errors=()):
    """One record per start (seconds), each taking `length_s`; the window is [first start, last + length]."""
    return [RequestRecord(target="t", level=1, worker=0, seq=i, salt="", send_ns=int(s * S),
                          complete_ns=int((s + length_s) * S), predicted_n=10,
                          error_kind=errors[i] if i < len(errors) else None)
            for i, s in enumerate(starts_s)]


TEN = list(range(10))  # starts 0..9 s, 1 s each: the window is [0, 10] s

# (starts, trim, expected kept starts, head, tail, too short): written before the first run.
CASES = [
    (TEN, Trim(share=0.10), list(range(1, 10)), 1, 0, False),  # cut 1 s: [1, 9]; start 9 is on the edge, kept
    (TEN, Trim(share=0.20), list(range(2, 9)), 2, 1, False),  # cut 2 s: [2, 8]
    (TEN, Trim(seconds=2.5), [3, 4, 5, 6, 7], 3, 2, False),  # [2.5, 7.5]
    (TEN, Trim(share=0.49), [5], 5, 4, False),  # cut 4.9 s: [4.9, 5.1]
    (TEN, Trim(seconds=6), TEN, 0, 0, True),  # [6, 4]: nothing would be left, so nothing is trimmed
    (TEN, Trim(seconds=0.5), list(range(1, 10)), 1, 0, False),  # [0.5, 9.5]
    ([], Trim(share=0.1), [], 0, 0, False),  # no record, nothing to trim
    ([0, 0, 0, 5], Trim(share=0.1), [5], 3, 0, False),  # window [0, 6], cut 0.6 s: the burst at 0 goes
]


@pytest.mark.parametrize("starts, trim, kept, head, tail, too_short", CASES)
def test_trim_leaves_out_the_records_started_in_each_end_of_the_window(starts, trim, kept, head, tail, too_short):
    got = trim_level(_level(starts), trim)
    assert [r.send_ns / S for r in got.kept] == kept
    assert (got.head, got.tail, got.too_short) == (head, tail, too_short)


def test_cancelled_records_do_not_stretch_the_window():
    # a request cancelled at Ctrl-C at 30 s counts in no wall time, so not in the window either
    rs = _level([*TEN, 30], errors=[None] * 10 + [records.CANCELLED])
    got = trim_level(rs, Trim(share=0.2))
    assert (got.head, got.tail) == (2, 2)  # window [0, 10]: the cancelled one started after 8 s too


def test_the_trimmed_figures_are_those_of_the_records_kept():
    rs = _level(TEN)
    got = trim_level(rs, Trim(share=0.2))
    summary = summarize_level(1, got.kept)
    assert summary.requests_ok == 7 and summary.wall_s == pytest.approx(7.0)  # starts 2..8, last ends at 9


def test_trim_text():
    assert Trim(share=0.1).text == "10%" and Trim(seconds=5).text == "5s"
    with pytest.raises(ValueError):
        Trim()


def test_sweep_trims_the_figures_and_keeps_the_records(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=2) as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--concurrency", "2", "--requests", "12",
                                    "--n-predict", "8", "--warmup", "0", "--trim", "20%", "--format", "json",
                                    "--output", out)
    assert code == 0, err
    doc = json.loads((out / "run.json").read_text())
    assert doc["config"]["trim"] == "20%"
    lv = doc["targets"][0]["levels"][0]
    rs = [RequestRecord.from_dict(json.loads(line)) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rs) == 12  # every record kept
    expected = trim_level(rs, Trim(share=0.2))
    assert expected.dropped > 0
    assert lv["trimmed"] == {"head": expected.head, "tail": expected.tail,
                             "cut_s": pytest.approx(expected.cut_s, abs=1e-6), "too_short": False}
    assert lv["requests_ok"] == len(expected.kept) == 12 - expected.dropped
    assert lv["wall_s"] == pytest.approx(summarize_level(2, expected.kept).wall_s)
    notes = json.loads(stdout)["notes"]
    assert any(n.startswith("--trim 20%:") and f"c=2 {expected.head} + {expected.tail} left out" in n for n in notes), notes
    load_run_dict(out)
    code, _, err = loadgen("export", out, "--format", "csv", "--output", tmp_path / "csv")
    assert code == 0, err
    row = next(csv.DictReader((tmp_path / "csv" / "levels.csv").open()))
    assert (int(row["trimmed_head"]), int(row["trimmed_tail"])) == (expected.head, expected.tail)


@pytest.mark.parametrize("args, message", [
    (("--trim", "50%"), "below 50%"),
    (("--trim", "ten%"), "not a share"),
    (("--trim", "0s"), "not a positive duration"),
    (("--trim", "10%", "--workers", "2"), "without --workers"),
])
def test_a_trim_that_cannot_be_kept_is_refused(loadgen, tmp_path, args, message):
    code, _, err = loadgen("sweep", "--ports", "9", *args, "--output", tmp_path / "run")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
