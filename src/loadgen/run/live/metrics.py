"""Live metrics: loadgen's own view of a run, for Prometheus to scrape while the run goes on.

`LiveMetrics` is fed from the engine's observer calls (`level_started`, `request_done`: the one
place a finished request's record passes) and from the probe's samples of `/slots`, and turns them
into Prometheus metric families when scraped (`collect`). Every series but the histograms is defined here, once; the histograms are the metrics of
analysis/metric_defs.py that name a `Live` series (name, help, buckets), fed by their vectorised
definitions in seconds:

| name (type) | labels | what |
| --- | --- | --- |
| `loadgen_requests_sent_total` (counter) | target, level | requests that left (completed + failed + in flight) |
| `loadgen_requests_completed_total` (counter) | target, level | requests that succeeded |
| `loadgen_requests_failed_total` (counter) | target, level, error_kind | failed requests by loadgen's error kind |
| `loadgen_output_tokens_total` (counter) | target, level | generated tokens of successful requests, as the server counted them |
| `loadgen_spec_decode_num_draft_tokens_total` (counter) | target, level | Σ `draft_n` of successful requests: tokens the server drafted for them (speculative decoding; llama-server's own `llamacpp:spec_decode_num_draft_tokens_total` counts the same over the whole server) |
| `loadgen_spec_decode_num_accepted_tokens_total` (counter) | target, level | Σ `draft_n_accepted`: of those, the ones the model kept |
| `loadgen_spec_decode_acceptance_ratio` (gauge) | target, level | the level's acceptance so far, accepted / drafted (analysis/speculation.py); no sample while nothing was drafted ("no speculation") |
| `loadgen_reasoning_tokens_total` (counter) | target, level | Σ `reasoning_tokens` of successful requests: the thinking part of their output tokens |
| `loadgen_reasoning_share_ratio` (gauge) | target, level | the level's reasoning share so far, reasoning / output tokens (analysis/reasoning.py); no sample while no request reasoned |
| `loadgen_requests_judged_total` (counter) | target, level | `--slo`: requests judged against the latency targets (all but those the client cancelled or lost) |
| `loadgen_requests_good_total` (counter) | target, level | `--slo`: of those, the good ones: succeeded and met every target (analysis/slo.py `judge`); `rate()` of it is the goodput in req/s |
| `loadgen_good_output_tokens_total` (counter) | target, level | `--slo`: output tokens of the good requests (goodput in tokens/s as a `rate()`) |
| `loadgen_slo_misses_total` (counter) | target, level, missed | `--slo`: requests that missed `missed` (a target's name, "error" or "unjudged"; a request may miss several) |
| `loadgen_slo_attainment_ratio` (gauge) | target, level | `--slo`: the level's attainment so far, good / judged (run.json's `slo.attainment`); no sample while nothing was judged |
| `loadgen_slo_attainment_required_ratio` (gauge) | | `--slo`: the attainment a level must reach (`--attainment`) |
| `loadgen_latency_seconds` (histogram) | target, level | end-to-end latency from the intended send (`analysis.metrics.latency_ms`) |
| `loadgen_time_to_first_token_seconds` (histogram) | target, level | TTFT, streaming only (`ttft_ms`) |
| `loadgen_inter_token_latency_seconds` (histogram) | target, level | each gap between content chunks, streaming only (`itl_ms`) |
| `loadgen_queue_wait_seconds` (histogram) | target, level | latency − prompt_ms − predicted_ms (`queue_wait_ms`) |
| `loadgen_<name>` (histogram) | target, level | any other metric of analysis/metric_defs.py with a `Live` part |
| `loadgen_energy_joules_total` (counter) | target, level, source | the level's energy from its first machine sample to its latest, by source (cpu, gpu, total; analysis/energy.py) |
| `loadgen_power_watts` (gauge) | target, level, source | the level's mean power so far: that energy / the seconds between those samples |
| `loadgen_joules_per_token` (gauge) | target, level, source | that energy / the level's output tokens so far (gross); no sample before a token |
| `loadgen_requests_in_flight` (gauge) | target | sent and not yet answered, now |
| `loadgen_level` (gauge) | target | the level running now: its concurrency, or its rate in req/s (open loop) |
| `loadgen_slots_busy` (gauge) | target | slots processing at the probe's last look at `/slots` |
| `loadgen_slots_total` (gauge) | target | slots `/slots` lists |
| `loadgen_slot_context_tokens` (gauge) | target, slot | context the slot's running task holds (n_prompt_tokens + n_decoded; 0 idle) |
| `loadgen_event_loop_lag_seconds` (histogram) | | how late a timer due every 100 ms ran on the client's event loop |
| `loadgen_client_cpu_seconds_total` (counter) | | CPU time of the loadgen process (all threads) |

The energy series exist only in a run that samples the machine (--environment, the default) on a
machine with RAPL or NVML counters; at a level's end they equal run.json's `energy` (gross figures;
the net ones need the idle power, measured before the run, and are in run.json only). The `--slo` series exist only in a run with latency targets; the misses of each target, "error"
and "unjudged" start at 0 like the rest. Series of every level of the run and of every fixed error kind are made at 0 when a target's
first level starts, so Prometheus sees them start from zero and `increase()` counts every request.
Counters never decrease and nothing is reset by a scrape: any number of scrapers see the same.

Cost: on the event loop, `request_done` only queues the record (a deque append); the records are
counted in batches over arrays, and the families built, in the endpoint's threads.
Classic buckets: prometheus_client writes native histograms only in its experimental OpenMetrics
2.0 text, and Prometheus 2.x reads them only from the protobuf format.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ...analysis import metric_defs
from ...analysis.energy import level_energy
from ...analysis.metric_defs import Batch
from ...analysis.slo import ERROR, UNJUDGED, Slo, judge
from ...analysis.speculation import Acceptance
from ...core import records
from ...core.records import LevelRun, RequestRecord
from ..engine import requests_done

PREFIX = "loadgen_"
# Bucket upper bounds in seconds. LLM requests take from tens of ms to minutes; a token gap from
# about a millisecond (a fast GPU) to a second (a CPU model under load).
# (The metrics' buckets are in analysis/metric_defs.py, beside each one's definition.)
LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1)
LOOP_LAG_INTERVAL_S = 0.1
# Error kinds that exist in every run, so their series start at 0 (HTTP ones appear when they happen).
FIXED_ERROR_KINDS = (records.CONNECT_ERROR, records.DISCONNECTED, records.TIMEOUT, records.INVALID_JSON,
                     records.SERVER_ERROR, records.STREAM_ERROR, records.TRUNCATED_STREAM, records.INVALID_OUTPUT,
                     records.STALLED)


class Buckets:
    """Counts of observations per bucket (upper bound inclusive, as Prometheus's `le`) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds_s: Sequence[float]):
        self.bounds = np.array([float(b) for b in bounds_s])
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def add(self, values_s: np.ndarray | Sequence[float]) -> None:
        """Observations in seconds; negative ones count as 0."""
        values = np.maximum(np.atleast_1d(np.asarray(values_s, dtype=np.float64)), 0.0)
        if values.size:
            self.counts += np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.counts))
            self.total += float(values.sum())

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """[(le, count of observations <= le), ..., ("+Inf", all)] and the sum, for the exposition."""
        running = np.cumsum(self.counts).tolist()
        labels = [f"{b:g}" for b in self.bounds.tolist()] + ["+Inf"]
        return list(zip(labels, running)), self.total


class LevelSeries:
    """The counters and histograms of one target at one level."""

    __slots__ = ("target", "level", "run", "completed", "failed", "output_tokens", "sent_seen", "metrics", "histograms",
                 "drafted", "accepted", "reasoning_tokens", "reasoned", "slo", "judged", "good", "good_tokens",
                 "slo_misses")

    def __init__(self, target: str, level: str, slo: Slo | None = None):
        self.target, self.level = target, level
        self.run: LevelRun | None = None  # the level while it runs (its in-flight requests)
        self.completed = 0
        self.failed: dict[str, int] = dict.fromkeys(FIXED_ERROR_KINDS, 0)
        self.output_tokens = 0
        self.sent_seen = 0
        self.drafted = self.accepted = 0  # Σ draft_n, Σ draft_n_accepted of successful requests
        self.reasoning_tokens = 0
        self.reasoned = False  # a successful request carried reasoning_tokens
        # One histogram per metric served live, by metric name (those registered when the level began).
        self.metrics = [m for m in metric_defs.all_metrics() if m.live is not None]
        self.histograms = {m.name: Buckets(m.live.buckets_s) for m in self.metrics if m.live is not None}
        # --slo: requests judged, good, their output tokens, and misses by what was missed (analysis/slo.py)
        self.slo = slo
        self.judged = self.good = self.good_tokens = 0
        self.slo_misses: dict[str, int] = dict.fromkeys((*slo.names, ERROR, UNJUDGED), 0) if slo else {}

    def add(self, batch: list[RequestRecord]) -> None:
        """Count finished requests of this target and level: each live metric's values are its
        vectorised definition (analysis/metric_defs.py) in seconds; failed requests count only by kind."""
        if self.slo is not None:
            self._judge(batch, self.slo)
        ok = [r for r in batch if r.error_kind is None]
        if len(ok) < len(batch):
            for r in batch:
                if r.error_kind is not None:
                    self.failed[r.error_kind] = self.failed.get(r.error_kind, 0) + 1
        if not ok:
            return
        self.completed += len(ok)
        self.output_tokens += sum([r.output_tokens or 0 for r in ok])
        self.drafted += sum([r.draft_n or 0 for r in ok])
        self.accepted += sum([r.draft_n_accepted or 0 for r in ok])
        reasoning = [r.reasoning_tokens for r in ok if r.reasoning_tokens is not None]
        self.reasoning_tokens += sum(reasoning)
        self.reasoned = self.reasoned or bool(reasoning)
        columns = Batch(ok)
        for m in self.metrics:
            self.histograms[m.name].add(m.vectorised(columns) / 1e3)

    def _judge(self, batch: list[RequestRecord], slo: Slo) -> None:
        """The level's requests judged as analysis/slo.py `SloTally` judges them (client-side ones not at all)."""
        for r in batch:
            if r.error_kind in records.CLIENT_SIDE:
                continue
            self.judged += 1
            missed = judge(r, slo)
            if not missed:
                self.good += 1
                self.good_tokens += r.output_tokens or 0
            for name in missed:
                self.slo_misses[name] = self.slo_misses.get(name, 0) + 1

    def sent(self) -> int:
        """Answered + in flight. A request that moved from in flight to answered since the last
        drain counts in neither: the counter keeps the highest value it has shown."""
        in_flight = len(self.run.in_flight) if self.run is not None else 0
        self.sent_seen = max(self.sent_seen, self.completed + sum(self.failed.values()) + in_flight)
        return self.sent_seen


def level_label(key: int | float) -> str:
    """A level's `level` label: its concurrency ("4") or its rate in req/s ("0.5")."""
    return f"{key:g}"


class LiveMetrics:
    """loadgen's live series; feed it as an engine observer (or wrap one with `observe`).

    The event loop only queues: a finished request's record, a loop-lag sample. `drain` (called by
    every scrape, and every second by the endpoint's thread) counts the queue in batches, off the
    loop, under a lock that the loop never takes.
    """

    def __init__(self, levels: Iterable[int | float] = (), slo: Slo | None = None):
        self.levels = tuple(levels)  # every level of the run, made at 0 with a target's first level
        self.slo = slo  # --slo: every request is judged against it too
        self.series: dict[tuple[str, str], LevelSeries] = {}  # (target, level label) -> its series
        self.current: dict[str, LevelRun] = {}  # target -> the level it runs now (or ran last)
        self.loop_lag = Buckets(LOOP_LAG_BUCKETS_S)
        self._finished: deque[RequestRecord] = deque()  # append on the loop, popleft in drain: both atomic
        self._lags: deque[float] = deque()
        self._lock = threading.Lock()
        self._lag_handle: asyncio.TimerHandle | None = None
        self.request_done = self._finished.append  # the observer call, as cheap as it can be
        self.requests_done = self._finished.extend  # a worker's batch of them

    def observe(self, inner: Any) -> LiveObserver:
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

    def _series(self, target: str, level: str) -> LevelSeries:
        found = self.series.get((target, level))
        # setdefault is atomic: the loop (a level's start) and a drain never make a series twice
        return found if found is not None else self.series.setdefault((target, level), LevelSeries(target, level, self.slo))

    def _start_loop_lag(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # fed by hand, not from a run
            return
        due = [loop.time() + LOOP_LAG_INTERVAL_S]
        lags = self._lags

        def tick() -> None:
            now = loop.time()
            lags.append(max(0.0, now - due[0]))
            due[0] = max(due[0] + LOOP_LAG_INTERVAL_S, now)  # after a long stall: not a burst
            self._lag_handle = loop.call_at(due[0], tick)

        self._lag_handle = loop.call_at(due[0], tick)

    # --- off the event loop ----------------------------------------------------------------------

    def drain(self) -> None:
        """Count what the loop has queued since the last drain."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        finished, lags = self._finished, self._lags
        batch = [finished.popleft() for _ in range(len(finished))]
        groups: dict[tuple[str, int | float], list[RequestRecord]] = {}
        for r in batch:
            groups.setdefault((r.target, r.level), []).append(r)
        for (target, level), records_ in groups.items():
            self._series(target, level_label(level)).add(records_)
        self.loop_lag.add([lags.popleft() for _ in range(len(lags))])

    # --- in the scraping thread ------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The metric families, as the scrape finds them now (everything queued is counted first)."""
        with self._lock:
            self._drain()
            return iter(list(self._families()))

    def _families(self) -> Iterator[Metric]:
        series = list(self.series.values())
        yield from _counters(series)
        if self.slo is not None:
            yield from _slo_families(series, self.slo)
        yield from _histograms(series)
        yield from _energy_families(series)
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

    requests_counted = None  # it reads every record: a worker's records are decoded for it

    def __init__(self, inner: Any, live: LiveMetrics):
        self._inner, self._live = inner, live
        self._queue, self._inner_done = live.request_done, inner.request_done

    def level_started(self, level: LevelRun, requests: int | None, duration_s: float | None) -> None:
        self._live.level_started(level, requests, duration_s)
        self._inner.level_started(level, requests, duration_s)

    def request_done(self, record: RequestRecord) -> None:
        self._queue(record)
        self._inner_done(record)

    def requests_done(self, batch: Sequence[RequestRecord]) -> None:
        self._live.requests_done(batch)
        requests_done(self._inner, batch)

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
    yield from _drafting_and_reasoning(series)


def _drafting_and_reasoning(series: list[LevelSeries]) -> Iterator[Metric]:
    """Speculative decoding's and reasoning's counters (0 from a level's start) and their ratios,
    each defined as analysis/speculation.py and analysis/reasoning.py define them per level."""
    labels = ["target", "level"]
    drafted = CounterMetricFamily(PREFIX + "spec_decode_num_draft_tokens", "Speculative: draft tokens the server "
                                  "generated for loadgen's successful requests (timings.draft_n)", labels=labels)
    accepted = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens", "Speculative: of those, draft tokens "
                                   "accepted by the target model (timings.draft_n_accepted)", labels=labels)
    acceptance = GaugeMetricFamily(PREFIX + "spec_decode_acceptance_ratio", "Speculative: the level's accepted / "
                                   "drafted tokens so far (no sample while nothing was drafted)", labels=labels)
    reasoning = CounterMetricFamily(PREFIX + "reasoning_tokens", "Reasoning (thinking) tokens of successful "
                                    "requests' output", labels=labels)
    share = GaugeMetricFamily(PREFIX + "reasoning_share_ratio", "The level's reasoning tokens / output tokens so far "
                              "(no sample while no request reasoned)", labels=labels)
    for s in series:
        key = [s.target, s.level]
        drafted.add_metric(key, s.drafted)
        accepted.add_metric(key, s.accepted)
        reasoning.add_metric(key, s.reasoning_tokens)
        rate = Acceptance(s.drafted, s.accepted, s.output_tokens).rate
        if rate is not None:
            acceptance.add_metric(key, rate)
        if s.reasoned and s.output_tokens:
            share.add_metric(key, s.reasoning_tokens / s.output_tokens)
    yield from (drafted, accepted, acceptance, reasoning, share)


def _energy_families(series: list[LevelSeries]) -> Iterator[Metric]:
    """--environment on a machine with energy counters: each level's energy by source from its first
    machine sample to its latest (analysis/energy.py `level_energy`, gross: no idle power here), its
    mean power and its joules per output token so far; no sample before a level's second machine sample."""
    labels = ["target", "level", "source"]
    joules = CounterMetricFamily(PREFIX + "energy_joules", "Energy the level used so far, from its first machine "
                                 "sample to its latest (RAPL packages: cpu, NVML: gpu, both: total)", labels=labels)
    watts = GaugeMetricFamily(PREFIX + "power_watts", "The level's mean power so far: its energy / the seconds "
                              "between those samples", labels=labels)
    per_token = GaugeMetricFamily(PREFIX + "joules_per_token", "The level's energy so far / its output tokens "
                                  "(gross; no sample before a token)", labels=labels)
    for s in series:
        samples = list(s.run.environment) if s.run is not None else []
        for e in level_energy(samples, s.output_tokens):
            key = [s.target, s.level, e.source]
            joules.add_metric(key, e.energy_j)
            watts.add_metric(key, e.mean_w)
            if e.j_per_token is not None:
                per_token.add_metric(key, e.j_per_token)
    yield from (joules, watts, per_token)


def _slo_families(series: list[LevelSeries], slo: Slo) -> Iterator[Metric]:
    """--slo: judged and good requests, good tokens and misses (counters from 0), the attainment so
    far per level (no sample before a request was judged) and the attainment required."""
    labels = ["target", "level"]
    judged = CounterMetricFamily(PREFIX + "requests_judged", "Requests judged against the latency targets (--slo)",
                                 labels=labels)
    good = CounterMetricFamily(PREFIX + "requests_good", "Requests that succeeded and met every latency target "
                               "(--slo); rate() of it is the goodput", labels=labels)
    tokens = CounterMetricFamily(PREFIX + "good_output_tokens", "Output tokens of the good requests (--slo)",
                                 labels=labels)
    misses = CounterMetricFamily(PREFIX + "slo_misses", "Requests that missed a latency target, by the target "
                                 "(or error, unjudged)", labels=[*labels, "missed"])
    attainment = GaugeMetricFamily(PREFIX + "slo_attainment_ratio", "The level's good / judged requests so far "
                                   "(--slo; no sample while nothing was judged)", labels=labels)
    for s in series:
        key = [s.target, s.level]
        judged.add_metric(key, s.judged)
        good.add_metric(key, s.good)
        tokens.add_metric(key, s.good_tokens)
        for missed, n in list(s.slo_misses.items()):
            misses.add_metric([*key, missed], n)
        if s.judged:
            attainment.add_metric(key, s.good / s.judged)
    required = GaugeMetricFamily(PREFIX + "slo_attainment_required_ratio",
                                 "The attainment a level must reach to pass (--attainment)")
    required.add_metric([], slo.attainment)
    yield from (judged, good, tokens, misses, attainment, required)


def _histograms(series: list[LevelSeries]) -> Iterator[Metric]:
    """One family per live metric (metric_defs' `Live`), in registration order."""
    shown: dict[str, metric_defs.Metric] = {}
    for s in series:
        shown.update((m.name, m) for m in s.metrics)
    for m in shown.values():
        assert m.live is not None  # only live metrics are in a series' list
        yield _histogram(m.live.name, m.live.help, ["target", "level"],
                         [([s.target, s.level], s.histograms[m.name]) for s in series if m.name in s.histograms])


def _histogram(name: str, documentation: str, labels: list[str],
               rows: list[tuple[list[str], Buckets]]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(PREFIX + name, documentation, labels=labels)
    for values, buckets in rows:
        cumulative, total = buckets.cumulative()
        family.add_metric(values, cumulative, total)
    return family
