"""A level's streaming aggregate (analysis/aggregate.py) against the per-record definitions.

Whatever batches the records come in, `LevelAggregate` must give each metric the values the
per-record functions of analysis/metrics.py give (ttft_ms, ttft_queue_ms, tpot_ms, itl_ms,
latency_ms, queue_wait_ms): the same histogram bucket for bucket, the same count, the same mean. The
records below mix what a run meets: non-stream and streamed successes, a streamed request whose
first token was not seen, one token, a negative gap (a read stamped before the previous one),
missing timings, failures and a cancelled request.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from loadgen.analysis import metrics
from loadgen.analysis.aggregate import LevelAggregate
from loadgen.core import records
from loadgen.core.records import RequestRecord

MS = 1_000_000


def mixed_records(n: int = 600, seed: int = 7) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        send = 10**12 + i * 3 * MS + rng.randint(0, MS)
        kind = i % 8
        common = dict(target="t", level=8, worker=i % 8, seq=i, salt=f"s{i}", send_ns=send, status=200,
                      prompt_ms=rng.uniform(1, 40), predicted_ms=rng.uniform(10, 400), predicted_n=rng.randint(1, 80),
                      predicted_per_second=rng.uniform(20, 200))
        if kind == 0:  # non-stream
            out.append(RequestRecord(complete_ns=send + rng.randint(5, 900) * MS, **common))
            continue
        if kind == 1:  # a failure
            out.append(RequestRecord(**{**common, "status": 500, "error_kind": "http_500", "predicted_n": None},
                                     complete_ns=send + 2 * MS))
            continue
        if kind == 2:  # cancelled at the end
            out.append(RequestRecord(**{**common, "status": None, "error_kind": records.CANCELLED},
                                     complete_ns=send + 7 * MS))
            continue
        gaps = [rng.randint(-50, 90_000) for _ in range(rng.randint(0, 70))]
        first = send + rng.randint(1, 300) * MS
        last = first + sum(max(g, 0) for g in gaps) * 1000
        fields = dict(first_token_ns=first, last_token_ns=last, chunk_gaps_us=gaps or None, chunks=len(gaps) + 1)
        if kind == 3:  # the first content event never seen, gaps still recorded
            fields.update(first_token_ns=None, last_token_ns=None)
        if kind == 4:  # one token
            common["predicted_n"], fields["chunk_gaps_us"] = 1, None
        if kind == 5:  # no timings from the server
            common.update(prompt_ms=None, predicted_ms=None, predicted_n=None, predicted_per_second=None)
        if kind == 6:  # an open-loop request sent late
            fields["intended_ns"] = send - rng.randint(0, 20) * MS
        out.append(RequestRecord(complete_ns=last + rng.randint(0, 5) * MS, **common, **fields))
    return out


def reference(rs: list[RequestRecord]) -> dict[str, list[float]]:
    ok = [r for r in rs if r.ok]
    return {
        "latency": [metrics.latency_ms(r) for r in ok],
        "queue_wait": [v for r in ok if (v := metrics.queue_wait_ms(r)) is not None],
        "ttft": [v for r in ok if (v := metrics.ttft_ms(r)) is not None],
        "ttft_queue": [v for r in ok if (v := metrics.ttft_queue_ms(r)) is not None],
        "tpot": [v for r in ok if (v := metrics.tpot_ms(r)) is not None],
        "itl": [g for r in ok for g in metrics.itl_ms(r)],
    }


@pytest.mark.parametrize("batch", [1, 7, 64, 10_000])
def test_every_metric_matches_the_per_record_definition_whatever_the_batches(batch):
    rs = mixed_records()
    agg = LevelAggregate()
    for i in range(0, len(rs), batch):
        agg.add_batch(rs[i:i + batch])
        agg.settle(rs[i + batch].send_ns if i + batch < len(rs) else None)
    for name, values in reference(rs).items():
        assert values, name  # the table exercises every metric
        series = agg.series[name]
        expected = metrics.histogram_ms(values)
        assert series.count == len(values), name
        assert list(series.histogram.counts) == list(expected.counts), name
        assert series.distribution().mean == pytest.approx(float(np.mean(values)), rel=1e-12), name


def test_a_streamed_gap_below_zero_counts_as_zero_and_a_missing_first_token_still_gives_gaps():
    base = dict(target="t", level=1, worker=0, salt="s", status=200, predicted_n=3, prompt_ms=5.0, predicted_ms=20.0)
    rs = [RequestRecord(seq=0, send_ns=0, complete_ns=40 * MS, first_token_ns=10 * MS, last_token_ns=30 * MS,
                        chunk_gaps_us=[-5, 20_000], chunks=3, **base),
          RequestRecord(seq=1, send_ns=50 * MS, complete_ns=90 * MS, chunk_gaps_us=[1_000], chunks=2, **base)]
    agg = LevelAggregate.of(rs)
    itl = agg.series["itl"]
    assert itl.count == 3 and itl.distribution().mean == pytest.approx((0 + 20 + 1) / 3)
    assert agg.series["ttft"].count == 1 and agg.series["ttft"].distribution().mean == pytest.approx(10.0)
    assert agg.series["ttft_queue"].distribution().mean == pytest.approx(5.0)
    assert agg.series["tpot"].distribution().mean == pytest.approx(10.0)  # (30 - 10) ms / (3 - 1)


def test_record_us_fills_the_buckets_one_value_at_a_time_would():
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.integers(0, 5_000, 5_000), rng.lognormal(10, 3, 5_000).astype(np.int64),
                             [0, 1, 2_047, 2_048, 4_095, 4_096, metrics.HISTOGRAM_HIGHEST_US, 10**13]])
    fast = metrics.new_histogram()
    metrics.record_us(fast, values)
    one_by_one = metrics.new_histogram()
    for v in values.tolist():
        one_by_one.record_value(min(max(v, metrics.HISTOGRAM_LOWEST_US), metrics.HISTOGRAM_HIGHEST_US))
    assert list(fast.counts) == list(one_by_one.counts)
    assert (fast.get_total_count(), fast.get_min_value(), fast.get_max_value()) == \
        (one_by_one.get_total_count(), one_by_one.get_min_value(), one_by_one.get_max_value())


@pytest.mark.parametrize("batch", [1, 5, 10_000])
def test_a_workers_histograms_gathered_in_batches_are_the_exporters(batch):
    from loadgen.analysis.aggregate import ProcessHistograms
    from loadgen.output.exporters import metric_histogram

    rs = mixed_records()
    gathered = ProcessHistograms()
    for i in range(0, len(rs), batch):
        gathered.add(rs[i:i + batch])
    assert gathered.records == len(rs)
    got = gathered.with_values()
    assert set(got) == {"latency", "ttft", "tpot"}
    for name, h in got.items():
        expected = metric_histogram(rs, name)
        assert h.get_total_count() == expected.get_total_count() > 0, name
        assert list(h.counts) == list(expected.counts), name
