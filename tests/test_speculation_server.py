"""Whether the server speculates at all: read from its /slots into the run's server section, and
what a level's acceptance then reads in the tables (and their json and csv)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from loadgen.analysis.aggregate import summarize_level
from loadgen.analysis.speculation import NO_SPECULATION, level_acceptance, level_acceptance_text
from loadgen.client.probe import Probe, server_speculates
from loadgen.core.records import RequestRecord
from loadgen.output.layout import grids_csv, grids_json
from loadgen.output.tables import sweep_table
from servers import SimThread


def _slot(i: int, speculative: object = None) -> dict:
    out: dict = {"id": i, "n_ctx": 4096, "is_processing": False}
    if speculative is not None:
        out["speculative"] = speculative
    return out


# (/slots entries' `speculative`, expected) -- written down before the test was first run.
SLOTS_CASES = [
    ([False, False], False),  # llama-server without a drafter
    ([True, True], True),  # --spec-type ngram-simple, -md
    ([True, False], True),  # one slot that can draft is speculation
    ([None, None], None),  # an older build that does not say
    ([], None),  # no slots listed
    (["yes", 1], None),  # not booleans: not taken as an answer
    ([None, False], False),  # the slots that say, say no
]


@pytest.mark.parametrize("flags, expected", SLOTS_CASES)
def test_server_speculates_reads_each_slots_speculative(flags, expected):
    assert server_speculates([_slot(i, f) for i, f in enumerate(flags)]) is expected


def test_server_speculates_ignores_what_is_not_a_slot_object():
    assert server_speculates(["x", 3, None, _slot(0, True)]) is True


# (server speculates, Σ draft_n, Σ draft_n_accepted, expected rate, expected text) -- written first.
LEVEL_CASES = [
    (False, None, None, None, NO_SPECULATION),  # a server that does not speculate
    (None, None, None, None, NO_SPECULATION),  # a server that did not say, nothing drafted
    (None, 0, 0, None, NO_SPECULATION),
    (True, None, None, 0.0, "0.0%"),  # speculates, drafted nothing at this level: 0%, not "no speculation"
    (True, 0, 0, 0.0, "0.0%"),
    (True, 40, 30, 0.75, "75.0%"),
    (None, 40, 10, 0.25, "25.0%"),  # what was drafted counts though the server did not say
    (False, 8, 8, 1.0, "100.0%"),  # ... and even when it said no
    (True, 8, 0, 0.0, "0.0%"),  # drafted, all rejected
]


@pytest.mark.parametrize("speculative, drafted, accepted, rate, text", LEVEL_CASES)
def test_a_levels_acceptance_depends_on_whether_its_server_speculates(speculative, drafted, accepted, rate, text):
    assert level_acceptance(speculative, drafted, accepted) == rate
    assert level_acceptance_text(speculative, drafted, accepted) == text


def _level(c: int, drafts: list[tuple[int, int] | None]) -> dict:
    rs = [RequestRecord(target="t", level=c, worker=0, seq=i, salt="", send_ns=0, complete_ns=10**9,
                        predicted_n=10, prompt_n=5, draft_n=None if d is None else d[0],
                        draft_n_accepted=None if d is None else d[1]) for i, d in enumerate(drafts)]
    return summarize_level(c, rs).to_dict()


def _doc() -> dict:
    """Three targets at c=1 and c=2: one that speculates (drafting at c=1 only), one that says it does
    not, one that did not say (no /slots)."""
    return {"kind": "sweep", "config": {"mode": "concurrency"}, "targets": [
        {"label": "spec", "server": {"speculative": True},
         "levels": [_level(1, [(10, 8), (30, 22)]), _level(2, [None, None])]},
        {"label": "plain", "server": {"speculative": False}, "levels": [_level(1, [None]), _level(2, [None])]},
        {"label": "other", "server": None, "levels": [_level(1, [None]), _level(2, [None])]},
    ]}


# (target, level, acceptance cell, drafted per output token) -- written down before running:
# spec c=1 drafted 40, accepted 30 over 20 output tokens; spec c=2 drafted nothing.
TABLE = [("spec", 1, "75.0%", 2.0), ("plain", 1, NO_SPECULATION, None), ("other", 1, NO_SPECULATION, None),
         ("spec", 2, "0.0%", 0.0), ("plain", 2, NO_SPECULATION, None), ("other", 2, NO_SPECULATION, None)]


def test_the_tables_json_and_csv_say_no_speculation_or_a_rate():
    grid = sweep_table(_doc())
    shown = json.loads(grids_json([grid], {}))["tables"][0]
    at, per = shown["columns"].index("draft accepted"), shown["columns"].index("drafted per out tok")
    level = 1
    rows = []
    for row in shown["rows"]:
        level = row[0] if row[0] != "" else level
        rows.append((row[1], level, row[at], row[per]))
    assert rows == TABLE
    lines = [line for line in grids_csv([grid]).splitlines() if not line.startswith("#")]
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    header = table[0]
    assert [r[header.index("draft accepted")] for r in table[1:]] == [t[2] for t in TABLE]


def test_the_columns_appear_for_a_speculating_server_that_drafted_nothing():
    doc = {"kind": "sweep", "config": {"mode": "concurrency"},
           "targets": [{"label": "spec", "server": {"speculative": True}, "levels": [_level(1, [None])]}]}
    shown = json.loads(grids_json([sweep_table(doc)], {}))["tables"][0]
    assert shown["rows"][0][shown["columns"].index("draft accepted")] == "0.0%"
    doc["targets"][0]["server"]["speculative"] = False
    assert "draft accepted" not in json.loads(grids_json([sweep_table(doc)], {}))["tables"][0]["columns"]


def test_the_probe_records_what_the_simulators_slots_say():
    """The simulator copies build 11434 without a drafter: every /slots entry says speculative false."""
    import asyncio

    async def ask(url: str):
        async with Probe(url) as probe:
            return await probe.server_info()

    with SimThread(slots=2) as sim:
        info = asyncio.run(ask(sim.url))
    assert info.speculative is False
    assert info.to_dict()["speculative"] is False


# (server speculates, drafts of the level's requests, expected report cells) -- written down first.
REPORT_CASES = [
    (True, [None], ["0.0%", "0.00"]),
    (False, [None], [NO_SPECULATION, "–"]),
    (None, [None], [NO_SPECULATION, "–"]),
    (True, [(10, 8), (30, 22)], ["75.0%", "2.00"]),
]


@pytest.mark.parametrize("speculative, drafts, cells", REPORT_CASES)
def test_the_reports_level_table_reads_the_servers_speculation_too(speculative, drafts, cells):
    from loadgen.core.rundoc import Level
    from loadgen.output.html import Extras, extra_cells

    level = Level(**_level(1, drafts))
    assert extra_cells(level, Extras(drafting=True), speculative) == cells
