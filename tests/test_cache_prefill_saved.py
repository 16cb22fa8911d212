"""Prefill saved by the prompt cache (analysis/cache.py), priced at the run's lowest level's prefill
cost per computed token, so the same cached tokens save the same at c=1 and c=2 although a batched
prefill's prompt_ms is counted once per request in the batch. Expected answers were written before
the code ran."""

from __future__ import annotations

import pytest

from loadgen.analysis.cache import lowest_level_prefill_ms_per_token, prefill_saved_ms
from loadgen.client.backends import GenerationParams
from loadgen.core.records import LevelRun, RequestRecord
from loadgen.results.writer import run_document
from loadgen.run.config import SweepConfig, Target
from loadgen.run.state import Run, TargetRun

# (level, Σ prompt_n computed, Σ prompt_ms) per level run -> the run's prefill ms per computed token
COST_CASES = [
    ([(1, 1000, 500.0), (2, 1000, 1000.0)], 0.5),  # c=2's batched prefill counted twice: not used
    ([(2, 1000, 1000.0), (1, 1000, 500.0)], 0.5),  # the lowest level, whatever order they ran in
    ([(1, 1000, 500.0), (1, 1000, 700.0), (2, 500, 900.0)], 0.6),  # a repeated lowest level pooled
    ([(1, 0, 0.0), (2, 1000, 1000.0)], 1.0),  # the lowest level that computed a token
    ([(0.5, 100, 30.0), (0.25, 200, 40.0)], 0.2),  # rates: the lowest rate
    ([(1, 0, 0.0)], None),
    ([], None),
]


@pytest.mark.parametrize("levels, expected", COST_CASES)
def test_the_prefill_cost_is_the_lowest_levels(levels, expected):
    got = lowest_level_prefill_ms_per_token(levels)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("cached, ms_per_token, expected", [
    (2000, 0.5, 1000.0), (0, 0.5, 0.0), (10, None, None),
])
def test_prefill_saved_is_the_cached_tokens_at_that_cost(cached, ms_per_token, expected):
    assert prefill_saved_ms(cached, ms_per_token) == expected


def _record(level: int, seq: int, prompt_ms: float) -> RequestRecord:
    return RequestRecord(target="t", level=level, worker=seq, seq=seq, salt="s", send_ns=0, complete_ns=200_000_000,
                         status=200, cache_n=900, prompt_n=100, prompt_ms=prompt_ms, predicted_n=4,
                         predicted_ms=20.0)


def test_the_same_cached_tokens_save_the_same_at_c1_and_c2_in_run_json():
    # c=1: each prompt's 100 computed tokens prefilled alone in 50 ms (0.5 ms a token). c=2: the two
    # prompts batched, each reporting the batch's 100 ms. Both levels reuse 1800 tokens: 900 ms saved
    # at each (the level's own cost would say 1800 ms at c=2).
    levels = []
    for c, prompt_ms in ((1, 50.0), (2, 100.0)):
        lv = LevelRun(target="t", concurrency=c, finished=True)
        lv.records.extend(_record(c, seq, prompt_ms) for seq in range(2))
        levels.append(lv)
    target = Target("http://127.0.0.1:9", "t")
    config = SweepConfig(targets=(target,), generation=GenerationParams(prompt="hi", n_predict=4),
                         concurrency=(1, 2), requests_per_level=2)
    run = Run(config, targets=[TargetRun(target=target, label="t", levels=levels)])
    doc = run_document(run, meta={})
    saved = {lv["level"]: lv["prefill_saved_ms"] for lv in doc["targets"][0]["levels"]}
    assert saved == {1: pytest.approx(900.0), 2: pytest.approx(900.0)}
