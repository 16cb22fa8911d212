"""Answers cut by the context, and short answers under --ignore-eos (analysis/cut_answers.py): a
table of cases whose expected verdicts were written before the rule (issue 46 item 7)."""

from __future__ import annotations

import json

import pytest

from loadgen.analysis.cut_answers import AnswerTally, judge_answer
from loadgen.core.records import RequestRecord, Usage
from loadgen.results.reader import load_records, load_run_dict

# (stop_type, finish_reason, tokens, asked) -> verdict: "cut", "short" or None (a full answer, or
# one that cannot be judged).
CASES = [
    # llama-server native: "limit" is n_predict reached, or the slot's context full; fewer tokens tells which
    ("limit", None, 400, 400, None),  # n_predict reached: full
    ("limit", None, 212, 400, "cut"),  # the -c 256 server of issue 46
    ("limit", None, 0, 400, "cut"),
    ("eos", None, 212, 400, "short"),  # the model stopped: short (a warning only with --ignore-eos)
    ("word", None, 10, 400, "short"),  # a stop word
    ("eos", None, 400, 400, None),
    ("limit", None, 401, 400, None),  # more than asked (n_predict 0 samples one): not short
    # OpenAI: finish_reason "length" is max_tokens reached, or the context
    (None, "length", 96, 96, None),
    (None, "length", 50, 96, "cut"),
    (None, "stop", 50, 96, "short"),
    (None, "stop", 96, 96, None),
    # Anthropic Messages records its stop_reason as finish_reason: "max_tokens" is its "length"
    (None, "max_tokens", 50, 96, "cut"),
    (None, "end_turn", 50, 96, "short"),
    # nothing to judge by
    ("limit", None, None, 400, None),  # no token count
    ("limit", None, 212, None, None),  # nothing asked known
    (None, None, 50, 96, "short"),  # no stop reason at all, fewer tokens than asked: short, not cut
]


@pytest.mark.parametrize("stop_type, finish_reason, tokens, asked, verdict", CASES)
def test_an_answer_is_cut_short_or_full(stop_type, finish_reason, tokens, asked, verdict):
    assert judge_answer(stop_type, finish_reason, tokens, asked) == verdict


def _record(tokens: int | None, stop_type=None, finish_reason=None, n_predict_target=None, error=None, usage=False):
    return RequestRecord(target="t", level=1, worker=0, seq=0, salt="s", send_ns=0, complete_ns=1,
                         error_kind=error, stop_type=stop_type, finish_reason=finish_reason,
                         tokens_predicted=None if usage else tokens,
                         usage=Usage(prompt_tokens=5, completion_tokens=tokens) if usage else None,
                         n_predict_target=n_predict_target)


def test_a_tally_judges_records_by_their_own_length_or_the_runs_and_merges():
    a, b = AnswerTally(), AnswerTally()
    a.add([_record(212, "limit"), _record(400, "limit"), _record(30, "eos"),
           _record(5, "limit", n_predict_target=8),  # a workload's own length: judged at once
           _record(8, "limit", n_predict_target=8),
           _record(3, "limit", error="server_error")])  # failed: not an answer
    b.add([_record(50, finish_reason="length", usage=True), _record(400, "eos")])
    a.merge(b.part())
    assert a.counts(400) == (3, 1)  # 212 and 50 on the limit, and 5 of 8; 30 stopped on EOS
    assert a.counts(None) == (1, 0)  # the run's n_predict unknown: only the records that carry theirs
    assert a.counts(40) == (1, 1)  # asked 40: 212, 400 and 50 are not short of it (30 is)


def _small_context_sim(n_ctx: int):
    import dataclasses

    from servers import SimThread

    sim = SimThread(slots=1)
    sim.profile = dataclasses.replace(sim.profile, n_ctx=n_ctx)
    return sim


def test_the_default_prompt_that_leaves_no_room_for_its_answer_is_refused_up_front(loadgen, tmp_path):
    # The default prompt is ~40 tokens on the simulator: with 200 to generate it needs ~240 of a
    # 128-token slot. Before, only --prompt-tokens was checked, and every answer came back cut.
    with _small_context_sim(128) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "2", "--n-predict", "200",
                               "--warmup", "0", "--output", tmp_path / "r")
    assert code == 2, err
    assert "cannot take the prompt" in err and "per-slot n_ctx 128" in err


def test_answers_cut_by_the_context_are_counted_and_named(loadgen, tmp_path):
    # Two prompts, one short (fits with its 48 tokens of answer), one long (~90 tokens: its answer
    # is cut at the slot's 128). The run goes ahead with a note up front; each long one is counted.
    data = tmp_path / "d.jsonl"
    long = " ".join(["word"] * 90)
    data.write_text(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": long}) + "\n")
    out = tmp_path / "r"
    with _small_context_sim(128) as sim:
        code, stdout, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "4", "--n-predict", "48",
                                    "--dataset", data, "--warmup", "0", "--output", out)
    assert code == 0, err
    assert "leave no room for n_predict 48" in err
    level = load_run_dict(out)["targets"][0]["levels"][0]
    records = load_records(out)
    cut = [r for r in records if r.output_tokens < 48]
    assert len(cut) == 2 and all(r.stop_type == "limit" for r in cut)
    assert level["answers_cut"] == 2 and "answers_short" not in level
    assert "2 answers cut by the context (2 at c=1)" in stdout


def test_a_workers_part_carries_its_answers_to_the_levels_aggregate_through_msgpack():
    import msgspec

    from loadgen.analysis.aggregate import LevelAggregate, Partial

    worker, level = LevelAggregate(), LevelAggregate()
    worker.add_batch([_record(212, "limit"), _record(30, "eos"), _record(5, "limit", n_predict_target=8)])
    part = msgspec.msgpack.decode(msgspec.msgpack.encode(worker.partial(0)), type=Partial)
    level.add_batch([_record(100, finish_reason="length", usage=True)])
    level.merge(part)
    summary = level.summary(1, n_predict=400)
    assert (summary.answers_cut, summary.answers_short) == (3, 1)
    assert "answers_cut" not in LevelAggregate.of([_record(400, "limit")]).summary(1, n_predict=400).to_dict()
