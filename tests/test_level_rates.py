"""A level's input tokens, successful req/s and total (input + output) tok/s (issue 34's missing
columns), from records and streamed alike. Expected figures written before the code ran."""

from __future__ import annotations

import pytest

from loadgen.analysis import metrics
from loadgen.analysis.aggregate import LevelAggregate, summarize_level
from loadgen.core.records import RequestRecord, Usage

MS = 1_000_000


def rec(seq, complete_ms, prompt_n=None, cache_n=None, usage=None, predicted_n=10, error=None):
    return RequestRecord(target="t", level=2, worker=0, seq=seq, salt="", send_ns=0, complete_ns=complete_ms * MS,
                         prompt_n=prompt_n, cache_n=cache_n, usage=usage, predicted_n=predicted_n, error_kind=error)


@pytest.mark.parametrize("record, expected", [
    (rec(0, 1, prompt_n=30), 30),
    (rec(0, 1, prompt_n=5, cache_n=25), 30),  # reused from the cache: still the prompt's tokens
    (rec(0, 1, usage=Usage(prompt_tokens=42)), 42),
    (rec(0, 1), None),
])
def test_input_tokens_of_a_request(record, expected):
    assert metrics.input_tokens(record) == expected


def test_level_input_tokens_request_rate_and_total_tok_s():
    # 2 s wall; 3 successful requests (30 + 30 + 42 input tokens, 10 output each), one failure not counted
    rs = [rec(0, 500, prompt_n=30), rec(1, 1000, prompt_n=5, cache_n=25), rec(2, 2000, usage=Usage(prompt_tokens=42)),
          rec(3, 1500, prompt_n=99, predicted_n=None, error="http_500")]
    summary = summarize_level(2, rs)
    assert summary.input_tokens == 102
    assert summary.request_rate == pytest.approx(1.5)
    assert summary.total_tok_s == pytest.approx((102 + 30) / 2)
    streamed = LevelAggregate()
    streamed.add_batch(rs[:2])
    streamed.add_batch(rs[2:])
    assert streamed.summary(2) == summary
