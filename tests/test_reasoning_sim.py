"""Reasoning-aware timing against the simulator's reasoning mode (the first N tokens are thinking).

Expected figures, written before running: with N = 4 thinking tokens and --n-predict 10, every
streamed request of chat, responses and messages has 4 reasoning tokens and 6 answer tokens, its
first answer arrives with its 5th content event (so TTFA − TTFT is the sum of its first four gaps),
and each level's reasoning share is 40%. With --n-predict 3 (below N) no answer ever comes.
"""

from __future__ import annotations

import pytest

from loadgen.analysis.metrics import ttft_ms
from loadgen.analysis.reasoning import answer_tokens, reasoning_share, ttfa_ms
from loadgen.results.reader import load_records, load_run_dict
from servers import SimThread

THINK = 4


@pytest.fixture(scope="module")
def sim():
    with SimThread(slots=2, reasoning_tokens=THINK) as server:
        yield server


def sweep(loadgen, sim, out, api, n_predict, *extra):
    code, stdout, err = loadgen("sweep", "--url", sim.url, "--api", api, "--stream", "--concurrency", "1,2",
                                "--requests", "4", "--n-predict", str(n_predict), "--output", str(out), *extra)
    assert code == 0, err
    return stdout


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_first_answer_token_and_the_token_split_are_exact(api, sim, loadgen, tmp_path):
    out = tmp_path / "run"
    table = sweep(loadgen, sim, out, api, 10)
    recs = load_records(out)
    assert len(recs) == 8
    for r in recs:
        assert (r.output_tokens, r.reasoning_tokens, answer_tokens(r), r.chunks) == (10, THINK, 6, 10)
        # the 5th content event is the first answer: its arrival is TTFT plus the first four gaps
        # (each gap floored to whole µs, so the sum is short by under 1 µs a gap)
        gap_ns = sum(r.chunk_gaps_us[:THINK]) * 1000
        assert 0 <= (r.first_answer_ns - r.first_token_ns) - gap_ns < THINK * 1000
        assert ttfa_ms(r) > ttft_ms(r) or gap_ns == 0
    assert reasoning_share(recs) == pytest.approx(0.4)
    for level in load_run_dict(out)["targets"][0]["levels"]:
        assert level["reasoning_tokens"] == 4 * THINK and level["reasoning_share"] == pytest.approx(0.4)
        assert level["ttfa_ms"]["count"] == 4
        assert level["ttfa_ms"]["mean"] >= level["ttft_ms"]["mean"]
    assert "reasoning" in table and "40%" in table


def test_a_stream_that_never_stops_thinking_has_no_first_answer(sim, loadgen, tmp_path):
    out = tmp_path / "run"
    sweep(loadgen, sim, out, "chat", 3)
    recs = load_records(out)
    assert all(r.reasoning_tokens == 3 and r.first_answer_ns is None and ttfa_ms(r) is None for r in recs)
    level = load_run_dict(out)["targets"][0]["levels"][0]
    assert level["reasoning_share"] == 1.0 and level["ttfa_ms"] is None


def test_without_reasoning_the_first_answer_is_the_first_token(loadgen, tmp_path):
    out = tmp_path / "run"
    with SimThread(slots=2) as plain:
        sweep(loadgen, plain, out, "chat", 6)
    recs = load_records(out)
    assert all(r.reasoning_tokens is None and r.first_answer_ns is None and ttfa_ms(r) == ttft_ms(r) for r in recs)
    assert "reasoning_tokens" not in load_run_dict(out)["targets"][0]["levels"][0]  # run.json keeps its old shape
