"""A level's figures gathered as its records go by: what stays in memory when the records do not.

`LevelAggregate.add_batch` takes records in any number of batches (a run feeds it each batch as it
is written to disk; `metrics.summarize_level` feeds it a whole list at once), and keeps only what
the summary needs: counts, exact sums for the means, one HdrHistogram per metric (µs, the bucketing
of `metrics.histogram_ms`), the first and last times, and a bounded sample of records for the
saturation verdict and the warm-up checks. So its memory does not grow with the level's length,
and a level summarised from a list and the same level streamed give the same `LevelSummary`.

concurrency_reached needs every send and completion in time order. Every event before the
earliest send still in flight is known (a request sent before it has completed and been added), so
`settle(watermark_ns)` sweeps those and forgets them; what is left is bounded by the requests sent
since the oldest one in flight left. Without a watermark (a list) everything is swept at the end.

The sample: a uniform reservoir of SAMPLE_SIZE records per level (deterministic: a fixed seed), so
a level of up to SAMPLE_SIZE requests keeps all of them and the verdict is the one all records give.
"""

from __future__ import annotations

import math
import operator
from collections import Counter
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import msgspec
import numpy as np
from hdrh.histogram import HdrHistogram

from ..core import records
from ..core.records import LevelRun, RequestRecord
from ..core.rundoc import Distribution, LevelSummary
from . import cache, metrics

SAMPLE_SIZE = 2000

# Every histogram a level keeps, by the name the exporters use (see output/exporters.py).
HISTOGRAMS = ("latency", "latency_uncorrected", "queue_wait", "predicted_ms", "ttft", "ttft_queue", "tpot", "itl",
              "schedule_lag")


def _sum_in_order(values: np.ndarray) -> float:
    """The values added one after the other, first to last, as Python 3.11's `sum` adds floats
    (3.12's compensates): every Python gives the same mean, the same as runs recorded before, and
    no Python float is made per value (a streamed level has 64 inter-token gaps per request)."""
    return float(np.cumsum(values)[-1]) if values.size else 0.0


class _Series:
    """Count, exact sum and HdrHistogram of one metric's millisecond values."""

    __slots__ = ("count", "total", "histogram")

    def __init__(self) -> None:
        self.count, self.total, self.histogram = 0, 0.0, metrics.new_histogram()

    def add(self, values_ms: np.ndarray | list[float]) -> None:
        values = np.asarray(values_ms, dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size:
            self.count += int(values.size)
            self.total += _sum_in_order(values)
            metrics.record_ms(self.histogram, values)

    def clear(self) -> None:
        self.count, self.total = 0, 0.0
        metrics.clear_histogram(self.histogram)

    def part(self) -> "SeriesPart":
        index, counts = metrics.occupied_counts(self.histogram)
        h = self.histogram
        return SeriesPart(self.count, self.total, index.tobytes(), counts.tobytes(), h.min_value, h.max_value)

    def merge(self, part: "SeriesPart") -> None:
        self.count += part.count
        self.total += part.total
        add_series_part(self.histogram, part)

    def distribution(self) -> Distribution | None:
        if not self.count:
            return None
        h = self.histogram
        at = h.get_percentile_to_value_dict([50, 90, 99])
        return Distribution(count=self.count, mean=self.total / self.count, p50=at[50] / 1000, p90=at[90] / 1000,
                            p99=at[99] / 1000, max=h.get_max_value() / 1000)


class _TokenSeries(_Series):
    """A `_Series` of token counts: each count is kept as that many µs (so exact up to 2048, then to
    3 significant digits, HdrHistogram's), its distribution in tokens."""

    __slots__ = ()

    def add(self, values_ms: np.ndarray | list[float]) -> None:
        super().add(np.asarray(values_ms, dtype=np.float64) / 1000)

    def distribution(self) -> Distribution | None:
        """Percentiles as the lowest count of their bucket (a count a request had, up to 2048), the
        max exact."""
        if not self.count:
            return None
        h = self.histogram
        at = h.get_percentile_to_value_dict([50, 90, 99])
        low = h.get_lowest_equivalent_value
        return Distribution(count=self.count, mean=round(self.total * 1000 / self.count, 3), p50=float(low(at[50])),
                            p90=float(low(at[90])), p99=float(low(at[99])), max=float(h.max_value))


class SeriesPart(msgspec.Struct, array_like=True):
    """A `_Series` as a worker process sends it: count, sum, and its histogram's occupied buckets
    (counts indexes and counts, int64 bytes) with its lowest and highest values."""

    count: int
    total: float
    index: bytes
    counts: bytes
    min_value: int
    max_value: int


def add_series_part(h: HdrHistogram, part: SeriesPart) -> None:
    """Add the histogram a `SeriesPart` carries to `h` (of the same layout)."""
    metrics.add_counts(h, np.frombuffer(part.index, np.int64), np.frombuffer(part.counts, np.int64), part.min_value,
                       part.max_value)


class Partial(msgspec.Struct):
    """What a worker process of `--workers` gathered from a batch of its records (`LevelAggregate.
    partial`): everything of a `LevelAggregate` but its sample (a worker keeps its own, sent once at
    the level's end: `merge_samples`). The parent adds it to the level's (`LevelAggregate.merge`)
    and so reads no record. `watermark_ns`: every request the worker sent before it is in this part
    or an earlier one (the worker's earliest send still in flight), on the worker's clock."""

    sent: int
    ok: int
    output_tokens: int
    errors: dict[str, int]
    first_start_ns: int | None
    last_complete_ns: int | None
    first_send_ns: int | None
    last_send_ns: int | None
    any_scheduled: bool
    series: dict[str, SeriesPart]
    connect: SeriesPart
    means: dict[str, tuple[int, float]]
    sends: bytes  # int64 send times of the batch's requests
    completes: bytes  # and their completion times
    watermark_ns: int


class Reservoir:
    """A uniform sample of up to `size` of the records offered (algorithm R, deterministic: a fixed
    seed): record i replaces a random slot with probability size / i; a batch's draws at once.
    Reservoirs whose samples are merged need seeds of their own (with one seed, two workers of
    as many records would keep the same places: records of the same moments)."""

    def __init__(self, size: int = SAMPLE_SIZE, seed: int = 0) -> None:
        self.size, self.seen = size, 0
        self.sample: list[RequestRecord] = []
        self._random = np.random.default_rng(seed)

    def add(self, batch: Sequence[RequestRecord]) -> None:
        sample, size, seen = self.sample, self.size, self.seen
        self.seen += len(batch)
        fill = max(0, min(len(batch), size - len(sample)))
        sample.extend(batch[:fill])
        if fill == len(batch):
            return
        ranks = np.arange(seen + fill + 1, seen + len(batch) + 1)
        slots = self._random.integers(0, ranks)
        for i in np.flatnonzero(slots < size).tolist():
            sample[int(slots[i])] = batch[fill + i]


def merge_samples(parts: Sequence[tuple[int, list[RequestRecord]]], size: int = SAMPLE_SIZE,
                  seed: int = 0) -> list[RequestRecord]:
    """One uniform sample of up to `size` records of the union of populations, from a uniform sample
    of each (`(population, sample)`, each sample min(population, size) records): how many come from
    each part is drawn as from the union (multivariate hypergeometric), then that many from its
    sample. A population of at most `size` in all gives all its records."""
    parts = [(n, list(sample)) for n, sample in parts if n > 0]
    total = sum(n for n, _ in parts)
    if total <= size:
        return [r for _, sample in parts for r in sample]
    rng = np.random.default_rng(seed)
    takes = rng.multivariate_hypergeometric([n for n, _ in parts], size)
    out: list[RequestRecord] = []
    for (_, sample), take in zip(parts, takes.tolist()):
        out.extend(sample[i] for i in sorted(rng.choice(len(sample), size=take, replace=False).tolist()))
    return out


class _Mean:
    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count, self.total = 0, 0.0

    def add(self, values: np.ndarray) -> None:
        vs = values[np.isfinite(values)]
        self.count += int(vs.size)
        self.total += _sum_in_order(vs)

    def value(self) -> float | None:
        return self.total / self.count if self.count else None


# The fields a batch is read by, one C call per record (operator.attrgetter), then as columns.
_FIELDS = ("error_kind", "send_ns", "complete_ns", "intended_ns", "prompt_ms", "predicted_ms",
           "predicted_per_second", "predicted_n", "tokens_predicted", "usage", "first_token_ns", "last_token_ns",
           "chunk_gaps_us", "connect_us")
_ROW = operator.attrgetter(*_FIELDS)


def _floats(column: tuple) -> np.ndarray:
    """A column of numbers or None as float64, None as NaN."""
    try:
        return np.array(column, dtype=np.float64)
    except TypeError:
        return np.array([math.nan if v is None else v for v in column], dtype=np.float64)


class _Columns:
    """One batch as numpy columns: what `LevelAggregate` reads."""

    def __init__(self, batch: Sequence[RequestRecord]) -> None:
        (errors, send, complete, intended, self.prompt_ms, self.predicted_ms, self.decode, predicted_n,
         tokens_predicted, usage, self.first_token, self.last_token, self.gaps, self.connect_us) = zip(*map(_ROW, batch))
        self.errors = errors
        self.send = np.array(send, dtype=np.int64)
        self.complete = np.array(complete, dtype=np.int64)
        if None in intended:  # records written before every record carried its intended send
            self.start = np.array([s if i is None else i for s, i in zip(send, intended)], dtype=np.int64)
        else:
            self.start = np.array(intended, dtype=np.int64)
        self.ok = np.array([e is None for e in errors], dtype=bool)
        self.counted = np.array([e not in records.CLIENT_SIDE for e in errors], dtype=bool)
        self.streamed = any(t is not None for t in self.first_token) or any(self.gaps)
        self.tokens = np.array([r.output_tokens or 0 for r in batch] if None in predicted_n else predicted_n,
                               dtype=np.int64)


class _FirstTokens:
    """A batch's successful streamed requests as columns: metrics.ttft_ms and tpot_ms without a
    Python call per request. `streamed`: a content event or gap came; `timed`: its first content
    event's time is known (ttft_ms valid there); `per_token`: first and last known, 2+ tokens."""

    def __init__(self, c: _Columns) -> None:
        first_known = np.array([t is not None for t in c.first_token], dtype=bool)
        self.streamed = c.ok & (first_known | np.array([bool(g) for g in c.gaps], dtype=bool))
        self.timed = self.streamed & first_known
        first = np.array([t or 0 for t in c.first_token], dtype=np.int64)
        self.ttft_ms = (first - c.start) / 1e6
        last_known = np.array([t is not None for t in c.last_token], dtype=bool)
        last = np.array([t or 0 for t in c.last_token], dtype=np.int64)
        self.per_token = self.timed & last_known & (c.tokens >= 2)
        self.tpot_ms = (last - first) / 1e6 / np.maximum(c.tokens - 1, 1)


# Per successful request, token counts (not times: `_TokenSeries`): the prompt as the server
# counted it and the answer. Not hgrm files (output/exporters.py names its metrics).
TOKEN_SERIES = ("prompt_n", "predicted_n")
# Per successful request with timings, the prompt tokens reused from the cache (`timings.cache_n`),
# and the TTFT of cache hits and misses apart (analysis/cache.py says what a hit is).
CACHE_TOKEN_SERIES = ("cache_n",)
CACHE_TTFT_SERIES = ("ttft_cache_hit", "ttft_cache_miss")


def _prompt_tokens(r: RequestRecord) -> float:
    """A record's prompt tokens as the server counted them: prompt_n, else usage.prompt_tokens."""
    if r.prompt_n is not None:
        return r.prompt_n
    usage = r.usage
    return math.nan if usage is None or usage.prompt_tokens is None else usage.prompt_tokens


# The histograms kept per worker process of `--workers N` (run/workers/parent.py: one .hlog per worker):
# one value per successful request each.
PROCESS_HISTOGRAMS = ("latency", "ttft", "tpot")


def _earliest(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else min(a, b)


def _latest(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else max(a, b)


def of_level(level: LevelRun) -> "LevelAggregate":
    """A level's aggregate: the one it streamed into, else one gathered from its records."""
    return level.aggregate if level.aggregate is not None else LevelAggregate.of(level.records)


def typical_latency_s(level: LevelRun) -> float | None:
    """The level's p50 latency of successful requests, in seconds (None without any): what the next
    level's requests can expect at least, for planning (run/schedule.connections_ahead)."""
    latency = of_level(level).series["latency"].distribution()
    return None if latency is None else latency.p50 / 1e3


class LevelAggregate:
    """Streaming figures of one level; see the module docstring."""

    def __init__(self, sample_size: int = SAMPLE_SIZE) -> None:
        self.series = {name: _Series() for name in HISTOGRAMS}
        self.series.update((name, _TokenSeries()) for name in TOKEN_SERIES + CACHE_TOKEN_SERIES)
        self.series.update((name, _Series()) for name in CACHE_TTFT_SERIES)
        self.connect = _Series()  # connect times of the requests that opened their connection
        self.means = {name: _Mean() for name in ("predicted_ms", "prompt_ms", "decode_tok_s")}
        self.errors: Counter[str] = Counter()
        self.sent = self.ok = self.output_tokens = 0
        self.first_start_ns: int | None = None  # non-cancelled requests: the level's wall time
        self.last_complete_ns: int | None = None
        self.first_send_ns: int | None = None  # every sent request: the achieved rate
        self.last_send_ns: int | None = None
        self.any_scheduled = False  # a request whose intended send differs from its actual one
        self.reservoir = Reservoir(sample_size)
        # Send and completion times not yet swept (numpy arrays, one per batch).
        self._sends: list[np.ndarray] = [np.empty(0, np.int64)]
        self._completes: list[np.ndarray] = [np.empty(0, np.int64)]
        self._in_flight = self._peak = 0

    @property
    def sample(self) -> list[RequestRecord]:
        """A uniform sample of the level's records (all of them up to SAMPLE_SIZE): what the
        saturation verdict and the warm-up checks read."""
        return self.reservoir.sample

    @sample.setter
    def sample(self, records: list[RequestRecord]) -> None:
        self.reservoir.sample = records

    @classmethod
    def of(cls, rs: Iterable[RequestRecord]) -> "LevelAggregate":
        agg = cls()
        agg.add_batch(list(rs))
        return agg

    def add_batch(self, batch: Sequence[RequestRecord], sample: bool = True) -> None:
        """Add a batch of records; `sample` False: not to the sample (a worker keeps its own)."""
        if not batch:
            return
        c = _Columns(batch)
        self._count(batch, c)
        self._distributions(batch, c)
        ok = c.ok
        self.means["predicted_ms"].add(_floats(c.predicted_ms)[ok])
        self.means["prompt_ms"].add(_floats(c.prompt_ms)[ok])
        self.means["decode_tok_s"].add(_floats(c.decode)[ok])
        if sample:
            self.reservoir.add(batch)

    def _count(self, batch: Sequence[RequestRecord], c: _Columns) -> None:
        self.sent += len(batch)
        ok = int(c.ok.sum())
        self.ok += ok
        self.output_tokens += int(c.tokens[c.ok].sum())
        if ok < len(batch):
            self.errors.update(e for e in c.errors if e is not None)
        first, last = int(c.send.min()), int(c.send.max())
        self.first_send_ns = first if self.first_send_ns is None else min(self.first_send_ns, first)
        self.last_send_ns = last if self.last_send_ns is None else max(self.last_send_ns, last)
        if c.counted.any():
            start, end = int(c.start[c.counted].min()), int(c.complete[c.counted].max())
            self.first_start_ns = start if self.first_start_ns is None else min(self.first_start_ns, start)
            self.last_complete_ns = end if self.last_complete_ns is None else max(self.last_complete_ns, end)
        self.any_scheduled = self.any_scheduled or bool((c.start != c.send).any())
        self._sends.append(c.send)
        self._completes.append(c.complete)

    def _distributions(self, batch: Sequence[RequestRecord], c: _Columns) -> None:
        s, ok = self.series, c.ok
        latency = (c.complete - c.start) / 1e6
        uncorrected = (c.complete - c.send) / 1e6
        s["latency"].add(latency[ok])
        s["latency_uncorrected"].add(uncorrected[ok])
        service = _floats(c.prompt_ms) + _floats(c.predicted_ms)  # NaN without timings: no queue wait
        s["queue_wait"].add(np.maximum(0.0, uncorrected - service)[ok & ~np.isnan(service)])
        s["predicted_ms"].add(_floats(c.predicted_ms)[ok])
        s["schedule_lag"].add(((c.send - c.start) / 1e6)[c.counted])
        self.connect.add(_floats(c.connect_us) / 1e3)
        s["prompt_n"].add(np.array([_prompt_tokens(r) for r in batch], dtype=np.float64)[ok])
        s["predicted_n"].add(c.tokens[ok & (c.tokens > 0)].astype(np.float64))
        cache_n = np.array([math.nan if r.cache_n is None else r.cache_n for r in batch], dtype=np.float64)
        s["cache_n"].add(cache_n[ok])
        if c.streamed:
            self._streamed(c, batch)

    def _streamed(self, c: _Columns, batch: Sequence[RequestRecord]) -> None:
        s, first = self.series, _FirstTokens(c)
        s["ttft"].add(first.ttft_ms[first.timed])
        hits = [cache.is_hit(r.cache_n, r.prompt_n) for r in batch]  # None (no timings): neither
        s["ttft_cache_hit"].add(first.ttft_ms[first.timed & np.array([h is True for h in hits], dtype=bool)])
        s["ttft_cache_miss"].add(first.ttft_ms[first.timed & np.array([h is False for h in hits], dtype=bool)])
        prompt = _floats(c.prompt_ms)
        s["ttft_queue"].add(np.maximum(0.0, first.ttft_ms - prompt)[first.timed & ~np.isnan(prompt)])
        s["tpot"].add(first.tpot_ms[first.per_token])
        gaps = [g for g, keep in zip(c.gaps, first.streamed.tolist()) if keep and g]
        if gaps:
            flat = np.fromiter(chain.from_iterable(gaps), dtype=np.int64, count=sum(map(len, gaps)))
            # ms as metrics.itl_ms gives them (a gap is never negative), summed in the same order
            s["itl"].add(np.maximum(flat, 0) / 1000)

    def partial(self, watermark_ns: int) -> Partial:
        """This aggregate's figures, its sample left out, as a worker sends them (see `Partial`);
        made of a fresh aggregate of one batch, whose send and completion times all go with it."""
        sends, completes = np.concatenate(self._sends), np.concatenate(self._completes)
        return Partial(
            sent=self.sent, ok=self.ok, output_tokens=self.output_tokens, errors=dict(self.errors),
            first_start_ns=self.first_start_ns, last_complete_ns=self.last_complete_ns,
            first_send_ns=self.first_send_ns, last_send_ns=self.last_send_ns, any_scheduled=self.any_scheduled,
            series={name: x.part() for name, x in self.series.items() if x.count}, connect=self.connect.part(),
            means={name: (m.count, m.total) for name, m in self.means.items()},
            sends=sends.astype(np.int64).tobytes(), completes=completes.astype(np.int64).tobytes(),
            watermark_ns=watermark_ns)

    def clear(self) -> None:
        """Back to an aggregate of no record, its histograms kept (a worker gathers each batch into
        the same one: `partial`, then `clear`). The sample is not the batch's: it is left as it is."""
        for series in (*self.series.values(), self.connect):
            series.clear()
        for mean in self.means.values():
            mean.count, mean.total = 0, 0.0
        self.errors.clear()
        self.sent = self.ok = self.output_tokens = 0
        self.first_start_ns = self.last_complete_ns = self.first_send_ns = self.last_send_ns = None
        self.any_scheduled = False
        self._sends, self._completes = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
        self._in_flight = self._peak = 0

    def merge(self, part: Partial) -> None:
        """Add a worker's `Partial` (its clock this one's): the figures of this aggregate and the
        part's records together, as `add_batch` of them would give them (the means' sums aside,
        added in another order)."""
        self.sent += part.sent
        self.ok += part.ok
        self.output_tokens += part.output_tokens
        self.errors.update(part.errors)
        self.first_start_ns = _earliest(self.first_start_ns, part.first_start_ns)
        self.first_send_ns = _earliest(self.first_send_ns, part.first_send_ns)
        self.last_complete_ns = _latest(self.last_complete_ns, part.last_complete_ns)
        self.last_send_ns = _latest(self.last_send_ns, part.last_send_ns)
        self.any_scheduled = self.any_scheduled or part.any_scheduled
        for name, series in part.series.items():
            self.series[name].merge(series)
        self.connect.merge(part.connect)
        for name, (count, total) in part.means.items():
            self.means[name].count += count
            self.means[name].total += total
        self._sends.append(np.frombuffer(part.sends, np.int64))
        self._completes.append(np.frombuffer(part.completes, np.int64))

    def settle(self, watermark_ns: int | None = None) -> None:
        """Sweep the send/completion events before `watermark_ns` (None: all) into the peak."""
        times, steps = self._pending()
        cut = len(times) if watermark_ns is None else int(np.searchsorted(times, watermark_ns, side="left"))
        if cut:
            running = self._in_flight + np.cumsum(steps[:cut])
            self._peak = max(self._peak, int(running.max()))
            self._in_flight = int(running[-1])
        rest = times[cut:], steps[cut:]
        self._sends = [rest[0][rest[1] > 0]]
        self._completes = [rest[0][rest[1] < 0]]

    def _pending(self) -> tuple[np.ndarray, np.ndarray]:
        """The events not yet swept in time order; at equal times a completion (-1) comes before a
        send (+1): back to back is no overlap."""
        sends, completes = np.concatenate(list(self._sends)), np.concatenate(list(self._completes))
        times = np.concatenate([completes, sends])
        steps = np.concatenate([np.full(completes.size, -1, np.int64), np.ones(sends.size, np.int64)])
        order = np.lexsort((steps, times))
        return times[order], steps[order]

    def concurrency_reached(self) -> int:
        """The peak so far, the events not yet settled included (not consumed)."""
        times, steps = self._pending()
        if not times.size:
            return self._peak
        return max(self._peak, int((self._in_flight + np.cumsum(steps)).max()))

    def histogram(self, name: str) -> HdrHistogram:
        return self.series[name].histogram

    def summary(self, concurrency: int, stopped_reason: str | None = None,
                server_metrics_delta: dict[str, float] | None = None, rate: float | None = None) -> LevelSummary:
        """The level's `LevelSummary` (see `metrics.summarize_level` for what counts where)."""
        errors = Counter(dict(self.errors))  # a copy in one step: a checkpoint reads from another thread
        cancelled = errors.pop(records.CANCELLED, 0)
        lost = errors.pop(records.LOST, 0)
        wall = 0.0 if self.first_start_ns is None else (self.last_complete_ns - self.first_start_ns) / 1e9
        s = self.series
        return LevelSummary(
            level=concurrency if rate is None else rate, concurrency=concurrency,
            concurrency_reached=self.concurrency_reached(), requests_ok=self.ok,
            requests_failed=sum(errors.values()), requests_cancelled=cancelled,
            requests_lost=lost,
            errors_by_kind=dict(sorted(errors.items())), output_tokens=self.output_tokens, wall_s=wall,
            throughput_tok_s=self.output_tokens / wall if wall > 0 else 0.0,
            latency_ms=s["latency"].distribution(), queue_wait_ms=s["queue_wait"].distribution(),
            predicted_ms_mean=self.means["predicted_ms"].value(), prompt_ms_mean=self.means["prompt_ms"].value(),
            decode_tok_s_mean=self.means["decode_tok_s"].value(), stopped_reason=stopped_reason,
            server_metrics_delta=dict(server_metrics_delta or {}), rate=rate,
            achieved_rate=self._achieved_rate() if rate is not None else None,
            ttft_ms=s["ttft"].distribution(), ttft_queue_ms=s["ttft_queue"].distribution(),
            tpot_ms=s["tpot"].distribution(), itl_ms=s["itl"].distribution(),
            latency_uncorrected_ms=s["latency_uncorrected"].distribution() if rate is not None else None,
            schedule_lag_ms=s["schedule_lag"].distribution() if rate is not None else None,
            connections_opened=self.connect.count, connect_ms=self.connect.distribution(),
            prompt_n=s["prompt_n"].distribution(), predicted_n=s["predicted_n"].distribution(),
            **self._cache_fields(),
        )

    def _cache_fields(self) -> dict[str, Any]:
        """The cache figures (analysis/cache.py) when any request reused a token; else none, so a
        run with the cache off keeps its summary's shape (its requests' cache_n are all 0)."""
        s = self.series
        cached = s["cache_n"].total * 1000  # a _TokenSeries keeps counts as µs
        if not s["cache_n"].count or cached <= 0:
            return {}
        computed = s["prompt_n"].total * 1000
        prompt_ms = self.means["prompt_ms"].total
        return {"cache_n": s["cache_n"].distribution(), "cache_hit_ratio": cache.hit_ratio(cached, computed),
                "ttft_cache_hit_ms": s["ttft_cache_hit"].distribution(),
                "ttft_cache_miss_ms": s["ttft_cache_miss"].distribution(),
                "prefill_saved_ms": cache.prefill_saved_ms(cached, computed, prompt_ms)}

    def _achieved_rate(self) -> float | None:
        if self.sent < 2 or self.last_send_ns <= self.first_send_ns:
            return None
        return (self.sent - 1) / ((self.last_send_ns - self.first_send_ns) / 1e9)

