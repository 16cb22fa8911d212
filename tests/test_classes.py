"""Request classes in one run (issue 35): a class's table and flag, the scenario key and --check,
the flags a run of classes refuses, and a run on the simulator (1 slot) where each class runs
alone, then beside the other, every record carries its class, and the verdict names the class
whose prefills held the slot."""

from __future__ import annotations

import pytest

from loadgen.core.errors import ConfigError
from loadgen.core.request_class import parse_class, parse_class_flag
from loadgen.results.reader import load_records, load_run
from servers import SimThread

# A slow prefill (2,000 tok/s) on one slot: a 1,500-token prompt holds it ~0.75 s (simulated).
PROFILE = """name = "slow-prefill"
model_alias = "slow-sim"
model_path = "/models/slow-sim.gguf"
prefill_tok_s = 2000.0
step_ms = 2.0
alpha = 0.25
n_ctx = 4096
eos_probability = 0.0
"""

SCENARIO = """mode = "sweep"
stream = true
warmup = 1

[[class]]
name = "agent"
prompt_tokens = 1500
n_predict = 8
concurrency = 1
requests = 3

[[class]]
name = "chat"
prompt_tokens = 64
n_predict = 4
concurrency = 1
requests = 6
slo = "ttft=50ms"
"""


def test_a_class_table_parses_with_its_defaults():
    c = parse_class({"name": "chat", "prompt_tokens": "uniform:32:64", "n_predict": 16})
    assert (c.name, c.workload.prompt_tokens.text, c.workload.n_predict.text) == ("chat", "uniform:32:64", "16")
    assert (c.concurrency, c.rate, c.requests, c.slo, c.workload.seed) == (1, None, 8, None, 0)
    r = parse_class({"name": "bg", "n_predict": 8, "rate": 2, "requests": 5, "seed": 3})
    assert (r.rate, r.requests, r.workload.prompt_tokens, r.workload.seed, r.load_text) == (2.0, 5, None, 3, "2 req/s")
    assert parse_class({"name": "w", "n_predict": 8, "concurrency": 4}).requests == 16  # max(8, 4×C)


BAD_TABLES = [
    ({"n_predict": 8}, "name: give each class a short name"),
    ({"name": "a b", "n_predict": 8}, "short name"),
    ({"name": "chat"}, "n_predict: missing"),
    ({"name": "chat", "n_predict": 8, "concurrency": 1, "rate": 2}, "concurrency or rate, not both"),
    ({"name": "chat", "n_predict": 8, "rate": 0}, "rate: expected requests/s above 0"),
    ({"name": "chat", "n_predict": 8, "concurrency": 0}, "concurrency: expected a whole number of at least 1"),
    ({"name": "chat", "n_predict": "uniform:9:1"}, "below the lowest"),
    ({"name": "chat", "n_predict": "dataset"}, "'dataset' answers are not taken here"),
    ({"name": "chat", "n_predict": 8, "slo": 5}, "slo: expected --slo's text"),
    ({"name": "chat", "n_predict": 8, "concurency": 2}, "unknown key 'concurency'"),
]


@pytest.mark.parametrize("table, phrase", BAD_TABLES)
def test_a_bad_class_is_one_line_naming_the_key(table, phrase):
    with pytest.raises(ConfigError) as info:
        parse_class(table, "[[class]]")
    assert phrase in str(info.value) and str(info.value).startswith("[[class]]") and "\n" not in str(info.value)


def test_the_flag_reads_as_the_table_slo_last_with_its_commas():
    table = parse_class_flag("name=chat,prompt_tokens=normal:64,8,n_predict=16,concurrency=2,slo=ttft=1s,e2e=3s")
    # a distribution's commas split it: the flag reads uniform: specs, and normal: ones belong in a file
    assert table["name"] == "chat" and table["slo"] == "ttft=1s,e2e=3s" and table["concurrency"] == 2
    flag = parse_class_flag("name=chat,prompt_tokens=uniform:32:64,n_predict=16,rate=0.5,slo=ttft=1s,e2e=3s")
    assert flag == {"name": "chat", "prompt_tokens": "uniform:32:64", "n_predict": "16", "rate": 0.5,
                    "slo": "ttft=1s,e2e=3s"}
    assert parse_class(flag).workload.n_predict.fixed == 16


def test_check_shows_the_classes_of_a_scenario_file(loadgen, tmp_path):
    path = tmp_path / "classes.toml"
    path.write_text(SCENARIO)
    code, out, err = loadgen("run", path, "--check", "--set", "url=http://127.0.0.1:9")
    assert code == 0, err
    assert "class agent: prompt_tokens 1500, n_predict 8, concurrency 1, 3 requests per phase" in err
    assert "class chat: prompt_tokens 64, n_predict 4, concurrency 1, 6 requests per phase, slo ttft=50ms" in err


@pytest.mark.parametrize("extra, phrase", [
    (("--set", "concurrency=[1,2]"), "carry their own load"),
    (("--set", "prompt_tokens=256"), "carry their own lengths"),
    (("--set", "workers=2"), "run in one process; drop --workers/--ray"),
    (("--set", "duration=10"), "drop --duration"),
    (("--set", "stream=false"), "class chat: slo ttft is measured on streamed responses only"),
])
def test_a_run_of_classes_refuses_what_would_contradict_them(loadgen, tmp_path, extra, phrase):
    path = tmp_path / "classes.toml"
    path.write_text(SCENARIO)
    code, _, err = loadgen("run", path, "--check", "--set", "url=http://127.0.0.1:9", *extra)
    assert code == 2 and phrase in err, err


def test_a_bad_class_in_a_scenario_names_the_file_and_the_key(loadgen, tmp_path):
    path = tmp_path / "classes.toml"
    path.write_text(SCENARIO.replace('name = "chat"', 'name = "chat"\nconcurency = 2'))
    code, _, err = loadgen("run", path, "--check", "--set", "url=http://127.0.0.1:9")
    assert code == 2 and f"{path}:5: class: unknown key 'concurency'" in err, err  # the first [[class]] line
    path.write_text(SCENARIO.replace('name = "agent"', 'name = "chat"'))
    code, _, err = loadgen("run", path, "--check", "--set", "url=http://127.0.0.1:9")
    assert code == 2 and "two classes are called 'chat'" in err, err


def test_two_classes_on_one_slot_the_chat_waits_behind_the_agents_prefills(loadgen, tmp_path):
    profile, scenario, out = tmp_path / "slow.toml", tmp_path / "classes.toml", tmp_path / "run"
    profile.write_text(PROFILE)
    scenario.write_text(SCENARIO)
    with SimThread(str(profile), slots=1, time_scale=0.2) as sim:
        code, stdout, err = loadgen("run", scenario, "--set", f"url={sim.url}", "--set", f"output={out}")
    assert code == 0, err
    records = load_records(out)
    by = {}
    doc = load_run(out)
    t = doc.targets[0]
    assert [(lv.request_class, lv.phase) for lv in t.levels] == [
        ("agent", "alone"), ("chat", "alone"), ("agent", "together"), ("chat", "together")]
    for r in records:
        by.setdefault(r.request_class, []).append(r)
    assert set(by) == {"agent", "chat"} and all(r.ok for r in records)
    # exact lengths: the sim's tokenizer cuts each prompt to the class's length; ignore_eos answers
    assert {(r.prompt_n, r.predicted_n, r.prompt_tokens_target, r.n_predict_target) for r in by["agent"]} == {
        (1500, 8, 1500, 8)}
    assert {(r.prompt_n, r.predicted_n) for r in by["chat"]} == {(64, 4)}
    alone, together = t.levels[:2], t.levels[2:]
    assert [lv.requests_ok for lv in alone] == [3, 6]  # each class's budget, alone
    # together until the first class spent its budget: every request sent then ran beside the other
    assert together[0].requests_ok == 3 or together[1].requests_ok == 6
    assert sum(lv.requests_ok for lv in t.levels) == len(records)
    # the chat's latency target is judged per phase: met alone, missed beside the agent
    assert alone[1].slo["attainment"] == 1.0 and together[1].slo["attainment"] < 0.5
    assert alone[0].slo is None  # the agent has no target
    chat, agent = {v.request_class: v for v in t.interference}["chat"], {
        v.request_class: v for v in t.interference}["agent"]
    assert (chat.held_by, chat.held_with, chat.metric) == ("agent", "prefills", "TTFT")
    assert chat.slowdown > 5 and agent.held_by is None and agent.slowdown < 1.5
    assert "agent's 1,500-token prefills hold the 1 slot" in chat.line and chat.line in stdout
    assert [c.name for c in doc.config.classes] == ["agent", "chat"] and doc.config.classes[1].slo == "ttft=50ms"
    assert t.verdict is None  # classes side by side are not a ladder
    assert doc.complete
    # read back: analyze reprints the classes' rows and lines, and reads no ladder into them
    code, stdout, err = loadgen("analyze", out)
    assert code == 0, err
    assert chat.line in stdout and "chat together" in stdout and "from c=1" not in stdout + err


def test_a_class_prompt_too_short_for_the_salt_names_the_class(loadgen, tmp_path):
    scenario, out = tmp_path / "classes.toml", tmp_path / "run"
    scenario.write_text(SCENARIO.replace("prompt_tokens = 64", "prompt_tokens = 2"))
    with SimThread(slots=1) as sim:
        code, _, err = loadgen("run", scenario, "--set", f"url={sim.url}", "--set", f"output={out}")
    assert code == 1 and "class chat: prompt_tokens draws 2:" in err, err


def test_compare_refuses_a_run_of_classes_beside_a_run_without_them_or_with_others():
    from loadgen.analysis.compare import CompareError, check_comparable

    def doc(classes):
        config = {"api": "completion", "mode": "concurrency", "n_predict": 96,
                  **({"classes": classes} if classes is not None else {})}
        return {"kind": "sweep", "complete": True, "config": config,
                "targets": [{"label": "a", "levels": [{"level": 1, "concurrency": 1, "requests_ok": 0, "requests_failed": 0,
                                                       "output_tokens": 0, "wall_s": 0.0, "throughput_tok_s": 0.0,
                                                       "predicted_ms_mean": None, "decode_tok_s_mean": None}]}]}

    chat = parse_class({"name": "chat", "prompt_tokens": 64, "n_predict": 16}).to_dict()
    agent = parse_class({"name": "agent", "prompt_tokens": 1500, "n_predict": 16}).to_dict()
    for base, cand in (([chat, agent], None), (None, [chat, agent]), ([chat, agent], [chat])):
        with pytest.raises(CompareError, match="classes"):
            check_comparable(doc(base), doc(cand))


def test_csv_export_of_a_run_of_classes_tells_the_rows_apart(loadgen, tmp_path):
    """levels.csv has each level's class and phase (a class alone and together share a concurrency,
    so without them two rows read the same), and requests.csv each request's class and phase."""
    import csv

    out, csv_dir = tmp_path / "run", tmp_path / "csv"
    with SimThread(slots=2, time_scale=0.05) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--stream", "--warmup", "0", "--output", out,
                               "--class", "name=long,prompt_tokens=200,n_predict=4,concurrency=1,requests=3",
                               "--class", "name=short,prompt_tokens=32,n_predict=2,concurrency=1,requests=5")
    assert code == 0, err
    code, _, err = loadgen("export", out, "--format", "csv", "--output", csv_dir)
    assert code == 0, err
    levels = list(csv.DictReader((csv_dir / "levels.csv").open()))
    assert [(r["request_class"], r["phase"], r["concurrency"]) for r in levels] == [
        ("long", "alone", "1"), ("short", "alone", "1"), ("long", "together", "1"), ("short", "together", "1")]
    requests = list(csv.DictReader((csv_dir / "requests.csv").open()))
    counted = {(r["request_class"], r["phase"]): int(r["requests_ok"]) + int(r["requests_failed"])
               + int(r["requests_cancelled"]) for r in levels}
    seen: dict[tuple[str, str], int] = {}
    for r in requests:
        seen[r["request_class"], r["phase"]] = seen.get((r["request_class"], r["phase"]), 0) + 1
    assert seen == counted and counted["long", "alone"] == 3 and counted["short", "alone"] == 5
