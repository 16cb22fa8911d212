"""One definition per metric (analysis/metric_defs.py): each metric's per-record and vectorised
definitions agree on random records, and a metric registered in a test shows in the latency
detail table, levels.csv and the live metrics without any of those modules knowing it."""

from __future__ import annotations

import csv
import io
import json
import random

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.analysis import metric_defs
from loadgen.analysis.aggregate import summarize_level
from loadgen.analysis.metric_defs import Batch, Live, Metric
from loadgen.core.records import RequestRecord, Usage
from loadgen.output.exporters import CsvExporter, select
from loadgen.output.layout import grids_json
from loadgen.output.tables import latency_table
from loadgen.run.live.metrics import LiveMetrics

MS = 1_000_000
ERRORS = [None, None, None, "timeout", "server_error", "cancelled", "lost"]


def _maybe(rng: random.Random, value, p_none: float = 0.2):
    return None if rng.random() < p_none else value


def random_record(rng: random.Random, seq: int) -> RequestRecord:
    """A record with every field a metric reads drawn at random, absent ones included: failed,
    cancelled and lost requests, no timings, no stream, an intended send or none, one token, only
    a usage count, negative chunk gaps (stamps out of order)."""
    send = rng.randrange(0, 10_000) * MS
    intended = _maybe(rng, send - rng.randrange(0, 500) * MS, 0.5)
    complete = send + rng.randrange(1, 5_000) * MS
    streamed = rng.random() < 0.7
    first = _maybe(rng, send + rng.randrange(0, 2_000) * MS) if streamed else None
    last = _maybe(rng, (first or send) + rng.randrange(0, 2_000) * MS) if streamed else None
    gaps = [rng.randrange(-200, 50_000) for _ in range(rng.randrange(0, 6))] if streamed and rng.random() < 0.8 \
        else None
    tokens = rng.choice([None, 0, 1, 2, 17, 300])
    return RequestRecord(
        target="a", level=2, worker=0, seq=seq, salt="s", send_ns=send, complete_ns=complete,
        status=200, error_kind=rng.choice(ERRORS),
        predicted_n=_maybe(rng, tokens, 0.3), tokens_predicted=_maybe(rng, tokens, 0.5),
        usage=_maybe(rng, Usage(completion_tokens=tokens), 0.5),
        prompt_n=_maybe(rng, rng.randrange(1, 4000)), prompt_ms=_maybe(rng, rng.uniform(0.1, 900.0)),
        predicted_ms=_maybe(rng, rng.uniform(0.1, 3000.0)), predicted_per_second=_maybe(rng, rng.uniform(1, 500)),
        intended_ns=intended, first_token_ns=first, last_token_ns=last, chunk_gaps_us=gaps,
        connect_us=_maybe(rng, rng.randrange(10, 5_000), 0.6),
        cache_n=_maybe(rng, rng.choice([0, rng.randrange(1, 4000)])),
        output_valid=_maybe(rng, rng.random() < 0.8, 0.5), tool_calls=_maybe(rng, rng.randrange(0, 3), 0.6))


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("metric", metric_defs.all_metrics(), ids=lambda m: m.name)
def test_the_per_record_and_vectorised_definitions_give_the_same_values(metric, seed):
    rng = random.Random(seed)
    batch = [random_record(rng, i) for i in range(rng.randrange(1, 60))]
    per_record = [v for r in batch for v in metric.values(r)]
    vectorised = metric.vectorised(Batch(batch))
    assert np.asarray(vectorised, dtype=np.float64).tolist() == pytest.approx(per_record, rel=1e-12, abs=1e-9)


def test_the_random_records_reach_every_branch_of_the_definitions():
    """The generator is worth its cases: each metric has values in some batch and none for some records."""
    rng = random.Random(0)
    batch = [random_record(rng, i) for i in range(400)]
    for m in metric_defs.all_metrics():
        counts = [len(m.values(r)) for r in batch]
        assert 0 in counts and any(counts), m.name


def test_every_metric_has_a_unit_headers_a_formula_and_a_run_json_key():
    for m in metric_defs.all_metrics():
        assert m.unit and m.header and m.short and m.formula.endswith("."), m.name
        assert m.key.startswith(m.name) and m.summary in ("distribution", "mean"), m.name


def test_a_name_is_defined_once():
    with pytest.raises(ValueError, match="defined already"):
        metric_defs.register(metric_defs.TTFT)


def _dummy_values(r: RequestRecord) -> float | None:
    """The test's metric: the decode time per output token, successful requests with timings."""
    n = r.output_tokens
    return r.predicted_ms / n if r.ok and r.predicted_ms is not None and n else None


def _dummy_vectorised(b: Batch) -> np.ndarray:
    keep = b.ok & ~np.isnan(b.predicted_ms) & (b.tokens > 0)
    return (b.predicted_ms / np.maximum(b.tokens, 1))[keep]


DUMMY = Metric("decode_ms_per_token", "ms", "decode ms per token", "decode/tok",
               "`predicted_ms` / output tokens (a test's metric).", _dummy_values, _dummy_vectorised,
               table=(("decode ms\nper token p50", "p50"),), table_digits=2, csv=("mean", "p99"),
               live=Live("decode_per_token_seconds", "Decode time per output token (a test's metric)", (0.01, 0.1, 1)))


def _records() -> list[RequestRecord]:
    # predicted_ms / predicted_n: 100/4 = 25 ms, 300/10 = 30 ms; the failed one has none.
    return [RequestRecord("a", 2, 0, 0, "s", 0, 500 * MS, 200, predicted_n=4, prompt_ms=50.0, predicted_ms=100.0),
            RequestRecord("a", 2, 1, 1, "s", 0, 600 * MS, 200, predicted_n=10, prompt_ms=50.0, predicted_ms=300.0),
            RequestRecord("a", 2, 0, 2, "s", 0, 700 * MS, 500, error_kind="server_error", predicted_n=9,
                          predicted_ms=900.0)]


def _run(records: list[RequestRecord]) -> dict:
    level = summarize_level(2, records).to_dict()
    return json.loads(json.dumps({"kind": "sweep", "config": {"mode": "concurrency"},
                                  "targets": [{"label": "a", "levels": [level]}]}))


def test_a_metric_registered_in_a_test_shows_in_the_level_table_the_csv_and_the_live_metrics():
    records = _records()
    with metric_defs.registered(DUMMY):
        run = _run(records)
        # run.json: under the level's "metrics", by name (25 and 30 ms: mean 27.5 exact; p99 the
        # larger, as its HdrHistogram bucket's highest equivalent value: within 0.1%)
        dist = run["targets"][0]["levels"][0]["metrics"]["decode_ms_per_token"]
        assert (dist["count"], dist["mean"]) == (2, 27.5)
        assert (dist["p50"], dist["p99"]) == (pytest.approx(25, rel=1e-3), pytest.approx(30, rel=1e-3))

        table = json.loads(grids_json([latency_table(run)], {}))["tables"][0]
        assert table["columns"] == ["target", "C", "E2E ms p99 from intended", "decode ms per token p50"]
        (row,) = table["rows"]
        assert (row[:2], row[-1]) == (["a", 2], round(dist["p50"], 2))

        files = dict(CsvExporter().render(select(run, records)))
        (line,) = csv.DictReader(io.StringIO(files["levels.csv"].decode()))
        assert (line["decode_ms_per_token_ms_mean"], line["decode_ms_per_token_ms_p99"]) == ("27.5", str(dist["p99"]))

        live = LiveMetrics()
        for r in records:
            live.request_done(r)
        live.drain()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(live)  # type: ignore[arg-type]
        samples = {(s.name, s.labels.get("le")): s.value for f in text_string_to_metric_families(
            generate_latest(registry).decode()) for s in f.samples if s.labels.get("target") == "a"}
        assert samples[("loadgen_decode_per_token_seconds_sum", None)] == pytest.approx(0.055)
        assert samples[("loadgen_decode_per_token_seconds_bucket", "0.01")] == 0
        assert samples[("loadgen_decode_per_token_seconds_bucket", "0.1")] == 2


def test_without_the_metric_nothing_of_it_shows_and_run_json_keeps_its_shape():
    run = _run(_records())
    level = run["targets"][0]["levels"][0]
    assert "metrics" not in level
    assert latency_table(run) is None  # no streaming, closed loop: only latency would show
    header = CsvExporter().render(select(run, _records()))[1][1].decode().splitlines()[0]
    assert "decode_ms_per_token" not in header
