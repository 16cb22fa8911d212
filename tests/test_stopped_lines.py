"""A level stopped before its end says what became of its requests (issue #46, 4): in open loop the
schedule's count adds up (ok + failed + cancelled + not sent = scheduled), in words under the tables."""

from __future__ import annotations

import json
from pathlib import Path

from loadgen.output.tables import run_lines, stopped_lines

RUN = Path(__file__).parent / "data" / "rate-sim-v2" / "run.json"


def _doc(**level) -> dict:
    doc = json.loads(RUN.read_text(encoding="utf-8"))
    doc["targets"][0]["levels"][0].update(level)
    return doc


def test_a_stopped_open_loop_level_names_its_cancelled_and_unsent_requests():
    doc = _doc(stopped_reason="interrupted", requests_ok=8, requests_cancelled=3, requests_not_sent=9,
               requests_scheduled=20)
    assert stopped_lines(doc) == [
        "warning: sim 5 req/s: stopped (interrupted) after 8 answers; 3 in flight cancelled, 9 of 20 "
        "scheduled not sent; its figures are those of the answered requests"]
    assert stopped_lines(doc)[0] in run_lines(doc).warnings


def test_a_level_that_ran_to_its_end_or_lost_nothing_says_nothing():
    assert stopped_lines(_doc()) == []
    assert stopped_lines(_doc(stopped_reason="interrupted", requests_cancelled=0, requests_not_sent=0)) == []
