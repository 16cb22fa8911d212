"""The cache commands through the CLI on a simulator: a chat run's per-turn table is printed again by
`analyze` (and shown by `report`, written by `export`) from the run's folder alone."""

from __future__ import annotations

import csv
import json

import pytest

from loadgen.results.reader import load_run_dict
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


def test_chat_messages_of_a_turn():
    from loadgen.client.backends.conversation import chat_messages
    assert chat_messages("s", [], "hi") == [{"role": "user", "content": "[s] hi"}]
    assert chat_messages("s", [("m1", "a1"), ("m2", "a2")], "m3") == [
        {"role": "user", "content": "[s] m1"}, {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "m2"}, {"role": "assistant", "content": "a2"}, {"role": "user", "content": "m3"}]


def test_chat_over_the_chat_completions_api_reuses_its_history(sim, loadgen, tmp_path):
    """--api chat: the history as messages to /v1/chat/completions. The simulator renders them with
    a ChatML template and reports `timings` and `usage`; turn k's whole prompt (cache_n + prompt_n)
    is usage.prompt_tokens, and from turn 2 on the server reuses the previous turn's whole prompt but
    its last token or so (the generation prompt's last newline, which the answer's text tokenizes
    into differently once it follows)."""
    from loadgen.analysis.cache import turn_of
    from loadgen.results.reader import load_records, load_run
    out = tmp_path / "chat-api"
    # --pin-slots: user u on slot u, so each turn finds its own history whichever slot the server would
    # have chosen (unpinned, about one run in ten put a second turn on a slot without it, cache_n 0;
    # this test is about the messages the chat API re-sends, not the slot choice)
    code, stdout, err = loadgen("chat", "--url", sim.url, "--api", "chat", "--users", USERS, "--turns", TURNS,
                                "--message-tokens", 16, "--n-predict", 4, "--pin-slots", "--output", out)
    assert code == 0, err
    assert "per turn" in stdout
    assert load_run(out).config.api == "chat"
    records = load_records(out)
    assert len(records) == USERS * TURNS and all(r.ok and r.finish_reason == "length" for r in records)
    for user in range(USERS):
        mine = sorted((r for r in records if r.worker == user), key=lambda r: r.seq)
        whole = [r.cache_n + r.prompt_n for r in mine]
        assert whole == [r.usage.prompt_tokens for r in mine]
        assert whole[0] < whole[1] < whole[2] and mine[0].cache_n == 0
        for before, r in zip(mine, mine[1:]):
            assert turn_of(r, USERS) == turn_of(before, USERS) + 1
            assert before.cache_n + before.prompt_n - 2 <= r.cache_n < r.cache_n + r.prompt_n, (before, r)


def test_chat_takes_an_openai_base_url_ending_in_v1_as_sweep_does(sim, loadgen, tmp_path):
    """`--url http://host:port/v1` (an OpenAI SDK user's base URL): the turns go to /v1/chat/completions,
    joined by core.baseurl's one rule as sweep's are, not to /v1/v1/chat/completions (HTTP 404)."""
    from loadgen.results.reader import load_records
    out = tmp_path / "chat-v1"
    code, _, err = loadgen("chat", "--url", f"{sim.url}/v1", "--api", "chat", "--users", 1, "--turns", 2,
                           "--message-tokens", 8, "--n-predict", 2, "--output", out)
    assert code == 0, err
    records = load_records(out)
    assert len(records) == 2 and all(r.ok and r.status == 200 for r in records), records


def test_chat_refuses_the_other_apis_in_one_line(loadgen, tmp_path):
    code, _, err = loadgen("chat", "--url", "http://127.0.0.1:9", "--api", "responses", "--model", "m",
                           "--output", tmp_path / "x")
    assert code == 2 and "--api chat" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command", [("chat", "--users", "2", "--turns", "3"), ("prefix", "--prefix-tokens", "32")])
def test_chat_and_prefix_are_judged_against_latency_targets(sim, loadgen, tmp_path, command):
    # --slo on chat and prefix (they took none): both stream, so a TTFT target is judged on every request;
    # an e2e target of 1 µs is missed by every one.
    code, _, err = loadgen(*command, "--url", sim.url, "--slo", "ttft=10s,e2e=1us", "--output", tmp_path / "run")
    assert code == 0, err
    doc = load_run_dict(tmp_path / "run")
    assert doc["kind"] == command[0]  # run.json names the command (schema 4; "sweep" before)
    (level,) = doc["targets"][0]["levels"]
    judged = level["slo"]
    assert judged["judged"] == level["requests_ok"] > 0 and judged["good"] == 0, judged
    assert judged["misses"] == {"e2e": judged["judged"]} and judged["ratio"]["ttft"] < 1, judged
