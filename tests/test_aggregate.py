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

import msgspec
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


def _worker_parts(rs: list[RequestRecord], batch: int, workers: int):
    """The records dealt out to `workers` a batch at a time, as worker processes gather them: per
    worker, its records and its parts (`Partial`, through the wire format and back); each part's
    watermark the first send of that worker's next batch (NO_MORE_SENDS after its last)."""
    from loadgen.run.workers.protocol import NO_MORE_SENDS, WorkerPartial, frame

    decode = msgspec.msgpack.Decoder(WorkerPartial).decode
    batches = [rs[i:i + batch] for i in range(0, len(rs), batch)]
    mine = [batches[k::workers] for k in range(workers)]
    out = []
    for k in range(workers):
        parts = []
        agg = LevelAggregate()  # one per worker, cleared after each part, as a worker does
        for j, b in enumerate(mine[k]):
            agg.add_batch(b, sample=False)
            watermark = mine[k][j + 1][0].send_ns if j + 1 < len(mine[k]) else NO_MORE_SENDS
            parts.append(decode(frame(WorkerPartial(part=agg.partial(watermark), offset=0))[4:]).part)
            agg.clear()
        out.append(([r for b in mine[k] for r in b], parts))
    return out


@pytest.mark.parametrize("batch, workers", [(1, 2), (7, 3), (64, 2), (10_000, 2)])
def test_workers_parts_merged_give_the_summary_of_every_record(batch, workers):
    rs = mixed_records()
    whole = LevelAggregate.of(rs).summary(8)
    merged = LevelAggregate()
    per_worker = _worker_parts(rs, batch, workers)
    watermarks = [None] * workers
    # the parent meets the parts in the order the batches were made, settling as far as it may
    for j in range(max(len(parts) for _, parts in per_worker)):
        for k, (_, parts) in enumerate(per_worker):
            if j < len(parts):
                merged.merge(parts[j])
                watermarks[k] = parts[j].watermark_ns
                if None not in watermarks:
                    merged.settle(min(watermarks))
    got = merged.summary(8)
    assert got.concurrency_reached == whole.concurrency_reached > 1
    for field in ("requests_ok", "requests_failed", "requests_cancelled", "errors_by_kind", "output_tokens", "wall_s",
                  "throughput_tok_s", "connections_opened"):
        assert getattr(got, field) == getattr(whole, field), field
    for field in ("predicted_ms_mean", "prompt_ms_mean", "decode_tok_s_mean"):
        assert getattr(got, field) == pytest.approx(getattr(whole, field), rel=1e-12), field
    for field in ("latency_ms", "queue_wait_ms", "ttft_ms", "ttft_queue_ms", "tpot_ms", "itl_ms"):
        a, b = getattr(got, field), getattr(whole, field)
        assert (a.count, a.p50, a.p90, a.p99, a.max) == (b.count, b.p50, b.p90, b.p99, b.max), field
        assert a.mean == pytest.approx(b.mean, rel=1e-12), field
    for name in merged.series:
        assert list(merged.series[name].histogram.counts) == list(LevelAggregate.of(rs).series[name].histogram.counts)


def test_a_workers_histograms_from_its_parts_are_the_exporters():
    from loadgen.analysis.aggregate import PROCESS_HISTOGRAMS, add_series_part
    from loadgen.output.exporters import metric_histogram

    for mine, parts in _worker_parts(mixed_records(), 7, 2):
        for name in PROCESS_HISTOGRAMS:
            h = metrics.new_histogram()
            for part in parts:
                if name in part.series:
                    add_series_part(h, part.series[name])
            expected = metric_histogram(mine, name)
            assert h.get_total_count() == expected.get_total_count() > 0, name
            assert list(h.counts) == list(expected.counts), name
            assert (h.get_min_value(), h.get_max_value()) == (expected.get_min_value(), expected.get_max_value())


@pytest.mark.parametrize("without_ctypes", [False, True])
def test_added_counts_are_the_histogram_added(monkeypatch, without_ctypes):
    rng = np.random.default_rng(3)
    a, b = metrics.new_histogram(), metrics.new_histogram()
    metrics.record_us(a, rng.integers(1, 10**6, 3_000))
    metrics.record_us(b, rng.lognormal(8, 2, 3_000).astype(np.int64) + 1)
    expected = metrics.new_histogram()
    expected.add(a)
    expected.add(b)
    index, counts = metrics.occupied_counts(b)
    if without_ctypes:
        monkeypatch.setattr(metrics, "_counts_array", lambda h: None)
    metrics.add_counts(a, index, counts, b.min_value, b.max_value)
    assert list(a.counts) == list(expected.counts)
    assert (a.get_total_count(), a.get_min_value(), a.get_max_value()) == \
        (expected.get_total_count(), expected.get_min_value(), expected.get_max_value())


def _records(n: int, tag: str) -> list[RequestRecord]:
    return [RequestRecord(target="t", level=1, worker=0, seq=i, salt=f"{tag}{i}", send_ns=i, complete_ns=i + 1)
            for i in range(n)]


@pytest.mark.parametrize("populations, size, expected_from_each", [
    ((3, 4), 10, (3, 4)),  # a union within the size: every record
    ((5, 5), 10, (5, 5)),  # exactly the size
    ((0, 6), 4, None),  # an empty part gives nothing
    ((10, 10, 10), 6, None),
    ((1, 1000), 50, None),
])
def test_merged_samples_are_a_sample_of_the_union(populations, size, expected_from_each):
    from loadgen.analysis.aggregate import Reservoir, merge_samples

    parts = []
    for k, n in enumerate(populations):
        reservoir = Reservoir(size)
        reservoir.add(_records(n, f"w{k}-"))
        parts.append((n, reservoir.sample))
    got = merge_samples(parts, size)
    assert len(got) == min(size, sum(populations))
    assert len({r.salt for r in got}) == len(got)  # no record twice
    from_each = tuple(sum(r.salt.startswith(f"w{k}-") for r in got) for k in range(len(populations)))
    if expected_from_each is not None:
        assert from_each == expected_from_each
    if populations[0] == 0:
        assert from_each[0] == 0
    assert merge_samples(parts, size) == got  # deterministic


def test_merged_samples_take_each_part_in_proportion_to_its_population():
    from loadgen.analysis.aggregate import Reservoir, merge_samples

    small, large = Reservoir(100), Reservoir(100)
    small.add(_records(1_000, "a"))
    large.add(_records(3_000, "b"))
    shares = [sum(r.salt.startswith("a") for r in merge_samples([(1_000, small.sample), (3_000, large.sample)], 100,
                                                                 seed=seed)) / 100 for seed in range(300)]
    assert 0.23 < float(np.mean(shares)) < 0.27  # 1,000 of 4,000


def test_workers_reservoirs_of_their_own_seeds_keep_different_places():
    """Two workers of as many records, with one seed, would keep the same places of their streams
    (records of the same moments): the merged sample would not be a sample of the level."""
    from loadgen.analysis.aggregate import Reservoir

    def places(seed: int, batch: int) -> list[int]:
        reservoir = Reservoir(100, seed=seed)
        rs = _records(5_000, "x")
        for i in range(0, len(rs), batch):
            reservoir.add(rs[i:i + batch])
        return sorted(r.seq for r in reservoir.sample)

    assert places(0, 64) == places(0, 64)  # deterministic
    assert len(set(places(0, 64)) & set(places(1, 64))) < 20  # ~2 of 100 by chance
