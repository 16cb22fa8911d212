"""`--n-predict dataset` (issue 35): each request asks for its dataset entry's recorded answer
length (a number, or the answer text counted with the server's /tokenize), entries without an
answer are left out and entries beyond the per-slot context skipped, each with a count."""

from __future__ import annotations

import json

import pytest

from loadgen.core.rundoc import DatasetFit
from loadgen.results.reader import load_records, load_run
from loadgen.run.dataset_answers import read_dataset_entries
from loadgen.sim.tokenizer import tokenize
from servers import SimThread


def _sharegpt(path):
    items = [{"conversations": [{"from": "system", "value": "be brief"},
                                {"from": "human", "value": f"Question {i}: " + "why " * (4 + i)},
                                {"from": "gpt", "value": "because " * (2 + 3 * i)}]} for i in range(6)]
    items.append({"conversations": [{"from": "human", "value": "unanswered"}]})
    items.append({"conversations": [{"from": "human", "value": "long " * 3000}, {"from": "gpt", "value": "ok"}]})
    path.write_text(json.dumps(items))
    return items


def test_entries_pair_the_first_human_turn_with_the_answer_after_it(tmp_path):
    path = tmp_path / "sg.json"
    items = _sharegpt(path)
    entries, missing = read_dataset_entries(str(path), "prompt", None)
    assert missing == 1 and len(entries) == 7
    assert entries[0].prompt == items[0]["conversations"][1]["value"]
    assert entries[0].answer == items[0]["conversations"][2]["value"]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"prompt": "a b c", "out": 7}\n{"prompt": "d", "out": "x y"}\n{"prompt": "e", "out": 0}\n')
    entries, missing = read_dataset_entries(str(jsonl), "prompt", "out")
    assert [e.answer for e in entries] == [7, "x y"] and missing == 1  # 0 tokens is no answer


def test_each_request_asks_for_its_entrys_answer_and_long_entries_are_skipped(loadgen, tmp_path):
    path = tmp_path / "sg.json"
    items = _sharegpt(path)
    out = tmp_path / "run"
    with SimThread() as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "12",
                                    "--dataset", path, "--n-predict", "dataset", "--warmup", "0", "--output", out)
    assert code == 0, err
    assert "1 entries without an answer left out" in err
    assert "1 of 7 dataset entries skipped" in err + stdout
    assert load_run(out).targets[0].dataset == DatasetFit(entries=7, skipped=1)
    # The answers' lengths on the simulator's tokenizer (no BOS on an answer), six entries in turn.
    answers = {len(tokenize(it["conversations"][2]["value"])) for it in items[:6]}
    records = load_records(out)
    assert len(records) == 12 and all(r.ok for r in records)
    assert {r.n_predict_target for r in records} == answers
    assert all(r.predicted_n == r.n_predict_target for r in records)


def test_a_jsonl_answer_field_of_token_counts_is_taken_as_it_is(loadgen, tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"item {i} " + "x " * i, "output_len": 3 + i}) + "\n"
                            for i in range(4)))
    out = tmp_path / "run"
    with SimThread() as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "8", "--dataset", path,
                               "--n-predict", "dataset", "--dataset-answer-field", "output_len", "--warmup", "0",
                               "--output", out)
    assert code == 0, err
    records = load_records(out)
    assert sorted({r.n_predict_target for r in records}) == [3, 4, 5, 6]
    assert all(r.predicted_n == r.n_predict_target for r in records)


@pytest.mark.parametrize("args, phrase", [
    (("--n-predict", "dataset"), "needs --dataset"),
    (("--dataset-answer-field", "out"), "needs --n-predict dataset"),
    (("--prompt-tokens", "dataset"), "write --n-predict dataset"),
    (("--n-predict", "dataset", "--prompt-tokens", "64", "--dataset", "DATA"), "drop --prompt-tokens"),
])
def test_dataset_answers_that_cannot_work_are_refused_in_one_line(loadgen, tmp_path, args, phrase):
    path = tmp_path / "sg.json"
    _sharegpt(path)
    args = tuple(str(path) if a == "DATA" else a for a in args)
    code, out, err = loadgen("sweep", "--ports", "9", *args, "--output", tmp_path / "run")
    assert code == 2, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("loadgen: error:")]
    assert phrase in line
