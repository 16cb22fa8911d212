"""Live metrics: loadgen's own view of a run, for Prometheus to scrape while the run goes on.

`LiveMetrics` is fed from the engine's observer calls (`level_started`, `request_done`: the one
place a finished request's record passes) and from the probe's samples of `/slots`, and turns them
into Prometheus metric families when scraped (`collect`). Every series is defined here, once:

| name (type) | labels | what |
| --- | --- | --- |
| `loadgen_requests_sent_total` (counter) | target, level | requests that left (completed + failed + in flight) |
| `loadgen_requests_completed_total` (counter) | target, level | requests that succeeded |
| `loadgen_requests_failed_total` (counter) | target, level, error_kind | failed requests by loadgen's error kind |
| `loadgen_output_tokens_total` (counter) | target, level | generated tokens of successful requests, as the server counted them |
| `loadgen_latency_seconds` (histogram) | target, level | end-to-end latency from the intended send (`analysis.metrics.latency_ms`) |
| `loadgen_time_to_first_token_seconds` (histogram) | target, level | TTFT, streaming only (`ttft_ms`) |
| `loadgen_inter_token_latency_seconds` (histogram) | target, level | each gap between content chunks, streaming only (`itl_ms`) |
| `loadgen_queue_wait_seconds` (histogram) | target, level | latency − prompt_ms − predicted_ms (`queue_wait_ms`) |
| `loadgen_requests_in_flight` (gauge) | target | sent and not yet answered, now |
| `loadgen_level` (gauge) | target | the level running now: its concurrency, or its rate in req/s (open loop) |
| `loadgen_slots_busy` (gauge) | target | slots processing at the probe's last look at `/slots` |
| `loadgen_slots_total` (gauge) | target | slots `/slots` lists |
| `loadgen_slot_context_tokens` (gauge) | target, slot | context the slot's running task holds (n_prompt_tokens + n_decoded; 0 idle) |
| `loadgen_event_loop_lag_seconds` (histogram) | | how late a timer due every 100 ms ran on the client's event loop |
| `loadgen_client_cpu_seconds_total` (counter) | | CPU time of the loadgen process (all threads) |

Series of every level of the run and of every fixed error kind are made at 0 when a target's
first level starts, so Prometheus sees them start from zero and `increase()` counts every request.
Counters never decrease and nothing is reset by a scrape: any number of scrapers see the same.

Cost: `request_done` runs on the event loop, once per request, and only adds to plain counters
and bucket counts (no locks, no I/O); the families are built in the scraping thread.
Classic buckets: prometheus_client writes native histograms only in its experimental OpenMetrics
2.0 text, and Prometheus 2.x reads them only from the protobuf format.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ..core import records
from ..core.records import LevelRun, RequestRecord

PREFIX = "loadgen_"
# Bucket upper bounds in seconds. LLM requests take from tens of ms to minutes; a token gap from
# about a millisecond (a fast GPU) to a second (a CPU model under load).
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1,
                 0.15, 0.2, 0.3, 0.5, 1, 2.5)
QUEUE_WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60,
                        120, 300)
LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
LOOP_LAG_INTERVAL_S = 0.1
# Error kinds that exist in every run, so their series start at 0 (HTTP ones appear when they happen).
FIXED_ERROR_KINDS = (records.CONNECT_ERROR, records.DISCONNECTED, records.TIMEOUT, records.INVALID_JSON,
                     records.SERVER_ERROR, records.STREAM_ERROR, records.TRUNCATED_STREAM)


class Buckets:
    """Counts of observations per bucket (upper bound inclusive, as Prometheus's `le`) and their sum."""

    __slots__ = ("bounds", "counts", "total", "_bounds_us")

    def __init__(self, bounds_s: Sequence[float]):
        self.bounds = tuple(float(b) for b in bounds_s)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0
        self._bounds_us = np.array([b * 1e6 for b in self.bounds])

    def add(self, value_s: float) -> None:
        self.counts[bisect_left(self.bounds, value_s)] += 1
        self.total += value_s

    def add_gaps_us(self, gaps_us: list[int]) -> None:
        """Many observations at once, in µs (a streamed response's chunk gaps); negatives count as 0."""
        gaps = np.maximum(np.asarray(gaps_us, dtype=np.float64), 0.0)
        per_bucket = np.bincount(np.searchsorted(self._bounds_us, gaps, side="left"), minlength=len(self.counts))
        counts = self.counts
        for i in np.flatnonzero(per_bucket).tolist():
            counts[i] += int(per_bucket[i])
        self.total += float(gaps.sum()) / 1e6

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """[(le, count of observations <= le), ..., ("+Inf", all)] and the sum, for the exposition."""
        counts, total = self.counts[:], self.total  # one copy: a consistent set of counts
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts):
            running += n
            out.append(("+Inf" if bound == float("inf") else f"{bound:g}", running))
        return out, total


class LevelSeries:
    """The counters and histograms of one target at one level."""

    __slots__ = ("target", "level", "run", "completed", "failed", "output_tokens", "sent_seen",
                 "latency", "ttft", "itl", "queue_wait")

    def __init__(self, target: str, level: str):
        self.target, self.level = target, level
        self.run: LevelRun | None = None  # the level while it runs (its in-flight requests)
        self.completed = 0
        self.failed: dict[str, int] = dict.fromkeys(FIXED_ERROR_KINDS, 0)
        self.output_tokens = 0
        self.sent_seen = 0
        self.latency = Buckets(LATENCY_BUCKETS_S)
        self.ttft = Buckets(TTFT_BUCKETS_S)
        self.itl = Buckets(ITL_BUCKETS_S)
        self.queue_wait = Buckets(QUEUE_WAIT_BUCKETS_S)

    def sent(self) -> int:
        """Answered + in flight. Read from another thread while a request moves from in flight to
        answered, that sum may dip by one: the counter keeps the highest value it has shown."""
        in_flight = len(self.run.in_flight) if self.run is not None else 0
        self.sent_seen = max(self.sent_seen, self.completed + sum(self.failed.values()) + in_flight)
        return self.sent_seen


def level_label(key: int | float) -> str:
    """A level's `level` label: its concurrency ("4") or its rate in req/s ("0.5")."""
    return f"{key:g}"


class LiveMetrics:
    """loadgen's live series; feed it as an engine observer (or wrap one with `observe`)."""

    def __init__(self, levels: Iterable[int | float] = ()):
        self.levels = tuple(levels)  # every level of the run, made at 0 with a target's first level
        self.series: dict[tuple[str, str], LevelSeries] = {}  # (target, level label) -> its series
        self._by_level: dict[tuple[str, int | float], LevelSeries] = {}  # the same, by the level's number
        self.current: dict[str, LevelRun] = {}  # target -> the level it runs now (or ran last)
        self.loop_lag = Buckets(LOOP_LAG_BUCKETS_S)
        self._lag_handle: asyncio.TimerHandle | None = None

    def observe(self, inner: Any) -> "LiveObserver":
        """An observer that feeds this and passes every call on to `inner`."""
        return LiveObserver(inner, self)

    # --- on the event loop -----------------------------------------------------------------------

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        target = level.target
        if target not in self.current:
            for key in self.levels:
                self._series(target, level_label(key))
        self._series(target, level_label(level.level)).run = level
        self.current[target] = level
        if self._lag_handle is None:
            self._start_loop_lag()

    def request_done(self, record: RequestRecord) -> None:
        """Count a finished request. Runs once per request on the event loop, so the formulas of
        `analysis.metrics` (latency_ms, ttft_ms, queue_wait_ms) are written out here in seconds,
        without calls (test_live_metrics checks that they agree)."""
        s = self._by_level.get((record.target, record.level))
        if s is None:
            s = self._by_level[(record.target, record.level)] = self._series(record.target, level_label(record.level))
        kind = record.error_kind
        if kind is not None:
            s.failed[kind] = s.failed.get(kind, 0) + 1
            return
        s.completed += 1
        s.output_tokens += record.output_tokens or 0
        send_ns, complete_ns = record.send_ns, record.complete_ns
        start_ns = send_ns if record.intended_ns is None else record.intended_ns
        buckets = s.latency
        value = (complete_ns - start_ns) / 1e9
        buckets.counts[bisect_left(buckets.bounds, value)] += 1
        buckets.total += value
        if record.first_token_ns is not None:
            buckets = s.ttft
            value = (record.first_token_ns - start_ns) / 1e9
            buckets.counts[bisect_left(buckets.bounds, value)] += 1
            buckets.total += value
            if record.chunk_gaps_us:
                s.itl.add_gaps_us(record.chunk_gaps_us)
        prompt_ms, predicted_ms = record.prompt_ms, record.predicted_ms
        if prompt_ms is not None and predicted_ms is not None:
            buckets = s.queue_wait
            value = (complete_ns - send_ns) / 1e9 - (prompt_ms + predicted_ms) / 1e3
            value = value if value > 0.0 else 0.0
            buckets.counts[bisect_left(buckets.bounds, value)] += 1
            buckets.total += value

    def _series(self, target: str, level: str) -> LevelSeries:
        s = self.series.get((target, level))
        if s is None:
            s = self.series[(target, level)] = LevelSeries(target, level)
        return s

    def _start_loop_lag(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # fed by hand, not from a run
            return
        due = [loop.time() + LOOP_LAG_INTERVAL_S]

        def tick() -> None:
            now = loop.time()
            self.loop_lag.add(max(0.0, now - due[0]))
            due[0] = max(due[0] + LOOP_LAG_INTERVAL_S, now)  # after a long stall: not a burst
            self._lag_handle = loop.call_at(due[0], tick)

        self._lag_handle = loop.call_at(due[0], tick)

    # --- in the scraping thread ------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The metric families, as the scrape finds them now."""
        series = list(self.series.values())
        yield from _counters(series)
        yield from _histograms(series)
        yield from self._gauges()
        yield _histogram("event_loop_lag_seconds", "How late a timer due every 100 ms ran on loadgen's event loop",
                         [], [([], self.loop_lag)])
        cpu = CounterMetricFamily(PREFIX + "client_cpu_seconds", "CPU time of the loadgen process, all threads")
        cpu.add_metric([], time.process_time())
        yield cpu

    def _gauges(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(PREFIX + "requests_in_flight", "Requests sent and not yet answered",
                                      labels=["target"])
        level = GaugeMetricFamily(PREFIX + "level", "The level running now: concurrency, or req/s (open loop)",
                                  labels=["target"])
        busy = GaugeMetricFamily(PREFIX + "slots_busy", "Slots processing at the last look at /slots",
                                 labels=["target"])
        total = GaugeMetricFamily(PREFIX + "slots_total", "Slots /slots lists", labels=["target"])
        context = GaugeMetricFamily(PREFIX + "slot_context_tokens",
                                    "Context the slot's running task holds: n_prompt_tokens + n_decoded (0 idle)",
                                    labels=["target", "slot"])
        for target, run in list(self.current.items()):
            in_flight.add_metric([target], len(run.in_flight))
            level.add_metric([target], run.level)
            sample = run.probe_samples[-1] if run.probe_samples else None
            if sample is not None and sample.busy_slots is not None:
                busy.add_metric([target], sample.busy_slots)
            if sample is not None and sample.slot_context_tokens is not None:
                total.add_metric([target], len(sample.slot_context_tokens))
                for slot, tokens in enumerate(sample.slot_context_tokens):
                    context.add_metric([target, str(slot)], tokens)
        yield from (in_flight, level, busy, total, context)


class LiveObserver:
    """Feeds `LiveMetrics` and passes every observer call on to the observer it wraps."""

    def __init__(self, inner: Any, live: LiveMetrics):
        self._inner, self._live = inner, live

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        self._live.level_started(level, requests, duration_s)
        self._inner.level_started(level, requests, duration_s)

    def request_done(self, record: RequestRecord) -> None:
        self._live.request_done(record)
        self._inner.request_done(record)

    def __getattr__(self, name: str) -> Any:  # message, level_done, step_started, ...
        return getattr(self._inner, name)


def _counters(series: list[LevelSeries]) -> Iterator[Metric]:
    labels = ["target", "level"]
    sent = CounterMetricFamily(PREFIX + "requests_sent", "Requests sent", labels=labels)
    completed = CounterMetricFamily(PREFIX + "requests_completed", "Requests that succeeded", labels=labels)
    failed = CounterMetricFamily(PREFIX + "requests_failed", "Failed requests by error kind",
                                 labels=[*labels, "error_kind"])
    tokens = CounterMetricFamily(PREFIX + "output_tokens", "Generated tokens of successful requests, "
                                 "as the server counted them", labels=labels)
    for s in series:
        key = [s.target, s.level]
        sent.add_metric(key, s.sent())
        completed.add_metric(key, s.completed)
        for kind, n in list(s.failed.items()):
            failed.add_metric([*key, kind], n)
        tokens.add_metric(key, s.output_tokens)
    yield from (sent, completed, failed, tokens)


def _histograms(series: list[LevelSeries]) -> Iterator[Metric]:
    yield _histogram("latency_seconds", "End-to-end latency from the intended send", ["target", "level"],
                     [([s.target, s.level], s.latency) for s in series])
    yield _histogram("time_to_first_token_seconds", "Time to the first content chunk (streaming)",
                     ["target", "level"], [([s.target, s.level], s.ttft) for s in series])
    yield _histogram("inter_token_latency_seconds", "Gaps between successive content chunks (streaming)",
                     ["target", "level"], [([s.target, s.level], s.itl) for s in series])
    yield _histogram("queue_wait_seconds", "Latency - prompt_ms - predicted_ms: waiting for a slot, plus HTTP",
                     ["target", "level"], [([s.target, s.level], s.queue_wait) for s in series])


def _histogram(name: str, documentation: str, labels: list[str],
               rows: list[tuple[list[str], Buckets]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=labels)
    for values, buckets in rows:
        cumulative, total = buckets.cumulative()
        family.add_metric(values, cumulative, total)
    return family
