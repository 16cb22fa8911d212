"""The cache commands through the CLI on a simulator: a chat run's per-turn table is printed again by
`analyze` (and shown by `report`, written by `export`) from the run's folder alone."""

from __future__ import annotations

import csv
import json

import pytest

from servers import SimThread

USERS, TURNS = 2, 3


@pytest.fixture(scope="module")
def sim():
    with SimThread(slots=2) as server:
        yield server


def _turn_table(stdout: str) -> list[str]:
    """The lines of the per-turn table(s): from its title to the next blank line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "per turn" in line)
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


@pytest.fixture
def chat_run(sim, loadgen, tmp_path):
    out = tmp_path / "chat"
    code, stdout, err = loadgen("chat", "--url", sim.url, "--users", USERS, "--turns", TURNS, "--message-tokens", 16,
                                "--n-predict", 4, "--output", out)
    assert code == 0, err
    return out, stdout


def test_analyze_reprints_the_per_turn_table_of_a_chat_run(chat_run, loadgen):
    out, live = chat_run
    table = _turn_table(live)
    # one row per turn, each with both users' requests, in turn order
    rows = [line.split("│") for line in table if line.strip().startswith("│") and line.split("│")[1].strip().isdigit()]
    assert [int(r[1]) for r in rows] == [1, 2, 3] and {int(r[2]) for r in rows} == {USERS}
    code, again, err = loadgen("analyze", out)
    assert code == 0, err
    assert _turn_table(again) == table
    code, md, err = loadgen("analyze", out, "--format", "markdown")
    assert code == 0 and md.count("per turn (medians") == 1, err


def test_report_and_export_show_the_turns(chat_run, loadgen, tmp_path):
    out, _ = chat_run
    code, md, err = loadgen("report", out, "--format", "markdown")
    assert code == 0 and "per turn (medians" in md, err
    code, _, err = loadgen("export", out, "--format", "csv", "--output", tmp_path / "csv")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "csv" / "turns.csv").open()))
    assert [int(r["turn"]) for r in rows] == [1, 2, 3] and {int(r["requests"]) for r in rows} == {USERS}
    # a later turn re-sends the history: its prompt is longer and reuses what the earlier turn left
    assert float(rows[2]["prompt_tokens_p50"]) > float(rows[0]["prompt_tokens_p50"])
    assert float(rows[0]["cache_n_p50"]) < float(rows[2]["cache_n_p50"])
    code, _, err = loadgen("export", out, "--format", "json", "--output", tmp_path / "json")
    assert code == 0, err
    turns = json.loads((tmp_path / "json" / "levels.json").read_text())["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3]
