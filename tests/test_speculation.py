"""Speculative decoding's acceptance per level: pure, from records; and its place in summaries."""

from __future__ import annotations

import pytest

from loadgen.analysis.aggregate import LevelAggregate, summarize_level
from loadgen.analysis.speculation import NO_SPECULATION, acceptance, acceptance_text
from loadgen.client.backends import GenerationParams, make_backend
from loadgen.core.records import RequestRecord


def rec(seq: int, predicted_n: int = 10, draft: tuple[int, int] | None = None, error: str | None = None) -> RequestRecord:
    d, a = draft if draft is not None else (None, None)
    return RequestRecord(target="t", level=1, worker=0, seq=seq, salt="s", send_ns=seq * 10**9,
                         complete_ns=seq * 10**9 + 5 * 10**8, error_kind=error, predicted_n=predicted_n,
                         predicted_ms=100.0, prompt_ms=10.0, draft_n=d, draft_n_accepted=a)


# (draft fields per record, expected acceptance, expected drafted per output token) -- written down
# before running: token-weighted, failures left out, nothing drafted is None ("no speculation").
CASES = [
    ([None, None], None, None),  # a server without speculation
    ([(0, 0), None], None, None),  # drafting fields present but nothing drafted: still no speculation
    ([(10, 10), (10, 0)], 0.5, 1.0),  # 20 drafted, 10 accepted, over 20 output tokens
    ([(40, 30), (1, 1)], 31 / 41, 41 / 20),  # token-weighted: not the mean of 0.75 and 1.0 (0.875)
    ([(8, 0), (8, 0)], 0.0, 16 / 20),  # drafted and all rejected: 0%, not "no speculation"
    ([(10, 9), (30, 30, "http_500")], 0.9, 10 / 10),  # a failed request counts in neither sum
]


@pytest.mark.parametrize("drafts,rate,per_token", CASES)
def test_acceptance_is_token_weighted_and_says_no_speculation(drafts, rate, per_token):
    rs = [rec(i, draft=None if d is None else d[:2], error=d[2] if d is not None and len(d) > 2 else None)
          for i, d in enumerate(drafts)]
    found = acceptance(rs)
    assert found.rate == pytest.approx(rate) if rate is not None else found.rate is None
    assert found.drafted_per_output_token == pytest.approx(per_token) if per_token is not None \
        else found.drafted_per_output_token is None
    summary = summarize_level(1, rs)
    assert summary.acceptance == found.rate or summary.acceptance == pytest.approx(found.rate)
    assert summary.drafted_per_output_token == found.drafted_per_output_token or \
        summary.drafted_per_output_token == pytest.approx(found.drafted_per_output_token)
    if all(d is None for d in drafts):
        assert "draft_n" not in summary.to_dict()  # old run.json shape kept without speculation


def test_acceptance_text():
    assert [acceptance_text(x) for x in (None, 0.0, 0.8234)] == [NO_SPECULATION, "0.0%", "82.3%"]


def test_worker_partials_merge_the_draft_sums():
    rs = [rec(i, draft=(10, i)) for i in range(6)]
    whole = LevelAggregate.of(rs).summary(1)
    merged = LevelAggregate()
    for part in (rs[:2], rs[2:]):
        agg = LevelAggregate()
        agg.add_batch(part, sample=False)
        merged.merge(agg.partial(0))
    assert (merged.summary(1).draft_n, merged.summary(1).draft_n_accepted) == (whole.draft_n, whole.draft_n_accepted) \
        == (60, 15)


def test_records_read_draft_fields_and_old_records_still_load():
    backend = make_backend("llamacpp", GenerationParams(prompt="p"))
    out = backend.parse(200, b'{"content":"x","stop":true,"tokens_predicted":3,"timings":{"prompt_n":2,'
                             b'"predicted_n":3,"draft_n":19,"draft_n_accepted":17}}')
    assert (out.draft_n, out.draft_n_accepted) == (19, 17)
    old = {"target": "t", "level": 1, "worker": 0, "seq": 0, "salt": "s", "send_ns": 0, "complete_ns": 1}
    assert RequestRecord.from_dict(old).draft_n is None
