"""A level's figures gathered as its records go by: what stays in memory when the records do not.

`LevelAggregate.add_batch` takes records in any number of batches (a run feeds it each batch as it
is written to disk; `summarize_level` feeds it a whole list at once), and keeps only what
the summary needs: counts, and per metric of analysis/metric_defs.py (its vectorised definition)
an exact sum for the mean and an HdrHistogram (µs, the bucketing of `metrics.histogram_ms`), the first and last times, and a bounded sample of records for the
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

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import numpy as np
from hdrh.histogram import HdrHistogram

from ..core import records
from ..core.records import LevelRun, RequestRecord
from ..core.rundoc import Distribution, LevelSummary
from . import cache, metric_defs, metrics
from .cut_answers import AnswerPart, AnswerTally
from .metric_defs import Batch
from .speculation import Acceptance

SAMPLE_SIZE = 2000


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

    def part(self) -> SeriesPart:
        index, counts = metrics.occupied_counts(self.histogram)
        h = self.histogram
        return SeriesPart(self.count, self.total, index.tobytes(), counts.tobytes(), h.min_value, h.max_value)

    def merge(self, part: SeriesPart) -> None:
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

    def percentiles(self, qs: Sequence[float]) -> dict[str, float] | None:
        """--percentiles: each chosen percentile of the histogram in ms (µs resolution, as the
        fixed ones), named by `metric_defs.percentile_label`; None without values."""
        if not self.count or not qs:
            return None
        at = self.histogram.get_percentile_to_value_dict(list(qs))
        return {metric_defs.percentile_label(q): at[q] / 1000 for q in qs}


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
    sends: bytes  # int64 send times of the batch's requests
    completes: bytes  # and their completion times
    watermark_ns: int
    input_tokens: int = 0  # prompt tokens of the successful requests (metrics.input_tokens)
    # speculation and reasoning sums (0 from a worker of an older version)
    draft_n: int = 0
    draft_n_accepted: int = 0
    drafted_counted: int = 0
    reasoning_tokens: int = 0
    reasoning_counted: int = 0
    answers: AnswerPart = AnswerPart()  # cut and short answers (analysis/cut_answers.py); none from an older worker


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


# The histograms kept per worker process of `--workers N` (run/workers/parent.py: one .hlog per worker):
# one value per successful request each.
PROCESS_HISTOGRAMS = ("latency", "ttft", "tpot")


def _earliest(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else min(a, b)


def _latest(a: int | None, b: int | None) -> int | None:
    return a if b is None else b if a is None else max(a, b)


def of_level(level: LevelRun) -> LevelAggregate:
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
        # One series per metric (metric_defs.all_metrics(), as registered when the level began);
        # token counts in a `_TokenSeries`, so their histogram keeps them exact.
        self.metrics = metric_defs.all_metrics()
        self.series = {m.name: _TokenSeries() if m.tokens else _Series() for m in self.metrics}
        self.errors: Counter[str] = Counter()
        self.sent = self.ok = self.output_tokens = self.input_tokens = 0
        # speculation and reasoning sums over successful requests, and how many carried the field
        self.draft_n = self.draft_n_accepted = self.drafted_counted = 0
        self.reasoning_tokens = self.reasoning_counted = 0
        self.answers = AnswerTally()  # answers cut by the context, or short (analysis/cut_answers.py)
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
    def of(cls, rs: Iterable[RequestRecord]) -> LevelAggregate:
        agg = cls()
        agg.add_batch(list(rs))
        return agg

    def add_batch(self, batch: Sequence[RequestRecord], sample: bool = True) -> None:
        """Add a batch of records; `sample` False: not to the sample (a worker keeps its own)."""
        if not batch:
            return
        c = Batch(batch)
        self._count(batch, c)
        self.answers.add(batch)
        for m in self.metrics:
            self.series[m.name].add(m.vectorised(c))
        if sample:
            self.reservoir.add(batch)

    def _count(self, batch: Sequence[RequestRecord], c: Batch) -> None:
        self.sent += len(batch)
        ok = int(c.ok.sum())
        self.ok += ok
        self.output_tokens += int(c.tokens[c.ok].sum())
        self.input_tokens += int(c.input_tokens[c.ok].sum())
        drafted, accepted, reasoning = c.draft_n, c.draft_n_accepted, c.reasoning_tokens
        carried = c.ok & ~np.isnan(drafted)
        self.drafted_counted += int(carried.sum())
        self.draft_n += int(drafted[carried].sum())
        self.draft_n_accepted += int(np.nan_to_num(accepted[carried]).sum())
        thought = c.ok & ~np.isnan(reasoning)
        self.reasoning_counted += int(thought.sum())
        self.reasoning_tokens += int(reasoning[thought].sum())
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

    def partial(self, watermark_ns: int) -> Partial:
        """This aggregate's figures, its sample left out, as a worker sends them (see `Partial`);
        made of a fresh aggregate of one batch, whose send and completion times all go with it."""
        sends, completes = np.concatenate(self._sends), np.concatenate(self._completes)
        return Partial(
            sent=self.sent, ok=self.ok, output_tokens=self.output_tokens, input_tokens=self.input_tokens,
            draft_n=self.draft_n, draft_n_accepted=self.draft_n_accepted, drafted_counted=self.drafted_counted,
            reasoning_tokens=self.reasoning_tokens, reasoning_counted=self.reasoning_counted,
            answers=self.answers.part(), errors=dict(self.errors),
            first_start_ns=self.first_start_ns, last_complete_ns=self.last_complete_ns,
            first_send_ns=self.first_send_ns, last_send_ns=self.last_send_ns, any_scheduled=self.any_scheduled,
            series={name: x.part() for name, x in self.series.items() if x.count},
            sends=sends.astype(np.int64).tobytes(), completes=completes.astype(np.int64).tobytes(),
            watermark_ns=watermark_ns)

    def clear(self) -> None:
        """Back to an aggregate of no record, its histograms kept (a worker gathers each batch into
        the same one: `partial`, then `clear`). The sample is not the batch's: it is left as it is."""
        for series in self.series.values():
            series.clear()
        self.errors.clear()
        self.sent = self.ok = self.output_tokens = self.input_tokens = 0
        # speculation and reasoning sums over successful requests, and how many carried the field
        self.draft_n = self.draft_n_accepted = self.drafted_counted = 0
        self.reasoning_tokens = self.reasoning_counted = 0
        self.answers.clear()
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
        self.input_tokens += part.input_tokens
        self.draft_n += part.draft_n
        self.draft_n_accepted += part.draft_n_accepted
        self.drafted_counted += part.drafted_counted
        self.reasoning_tokens += part.reasoning_tokens
        self.reasoning_counted += part.reasoning_counted
        self.answers.merge(part.answers)
        self.errors.update(part.errors)
        self.first_start_ns = _earliest(self.first_start_ns, part.first_start_ns)
        self.first_send_ns = _earliest(self.first_send_ns, part.first_send_ns)
        self.last_complete_ns = _latest(self.last_complete_ns, part.last_complete_ns)
        self.last_send_ns = _latest(self.last_send_ns, part.last_send_ns)
        self.any_scheduled = self.any_scheduled or part.any_scheduled
        for name, series in part.series.items():
            self.series[name].merge(series)
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
                server_metrics_delta: dict[str, float] | None = None, rate: float | None = None,
                percentiles: Sequence[float] = (), prefill_ms_per_token: float | None = None,
                n_predict: int | None = None) -> LevelSummary:
        """The level's `LevelSummary` (see `summarize_level` for what counts where); `percentiles`
        (--percentiles): those of each of metric_defs.PERCENTILE_METRICS too, under "percentiles";
        `prefill_ms_per_token`: the run's lowest level's prefill cost, which prices the prefill the
        cache saved (analysis/cache.py; None: this level's own); `n_predict`: the run's, that answers
        without their own asked length are judged against (answers_cut, answers_short:
        analysis/cut_answers.py)."""
        answers_cut, answers_short = self.answers.counts(n_predict)
        errors = Counter(dict(self.errors))  # a copy in one step: a checkpoint reads from another thread
        cancelled = errors.pop(records.CANCELLED, 0)
        lost = errors.pop(records.LOST, 0)
        first, last = self.first_start_ns, self.last_complete_ns  # set together
        wall = 0.0 if first is None or last is None else (last - first) / 1e9
        open_loop = rate is not None
        figures: dict[str, object] = {}
        others: dict[str, Distribution | float] = {}
        for m in self.metrics:
            series = self.series[m.name]
            if m.open_loop and not open_loop:
                continue  # closed loop: the intended send is the actual one
            value = series.distribution() if m.summary == "distribution" else \
                (series.total / series.count if series.count else None)
            if m.name in metric_defs.BUILT_IN:
                figures[m.key] = value
            elif value is not None:
                others[m.name] = value
        self._cache_fields(figures, prefill_ms_per_token)
        ttfa = figures.pop("ttfa_ms", None)  # kept only where a request reasoned (`_reasoning`)
        assert ttfa is None or isinstance(ttfa, Distribution)
        return LevelSummary(
            level=concurrency if rate is None else rate, concurrency=concurrency,
            concurrency_reached=self.concurrency_reached(), requests_ok=self.ok,
            requests_failed=sum(errors.values()), requests_cancelled=cancelled,
            requests_lost=lost, answers_cut=answers_cut, answers_short=answers_short,
            errors_by_kind=dict(sorted(errors.items())), output_tokens=self.output_tokens, wall_s=wall,
            throughput_tok_s=self.output_tokens / wall if wall > 0 else 0.0,
            input_tokens=self.input_tokens, request_rate=self.ok / wall if wall > 0 else 0.0,
            total_tok_s=(self.input_tokens + self.output_tokens) / wall if wall > 0 else 0.0,
            stopped_reason=stopped_reason,
            server_metrics_delta=dict(server_metrics_delta or {}), rate=rate,
            achieved_rate=self._achieved_rate() if open_loop else None,
            connections_opened=self.series["connect"].count,
            metrics=others, percentiles=self._chosen_percentiles(percentiles),
            **self._drafting(), **self._reasoning(ttfa),
            **figures,  # type: ignore[arg-type]  # each metric's key is a LevelSummary field
        )

    def _chosen_percentiles(self, qs: Sequence[float]) -> dict[str, dict[str, float]] | None:
        """metric key -> {"p95": ms, ...} of each percentile metric with values; None without --percentiles."""
        if not qs:
            return None
        chosen = {m.key: self.series[m.name].percentiles(qs) for m in metric_defs.PERCENTILE_METRICS}
        return {key: at for key, at in chosen.items() if at is not None}

    def prefill_totals(self) -> tuple[float, float]:
        """(Σ prompt_n, Σ prompt_ms) of the level: what its prefill cost per computed token is made of
        (analysis/cache.py)."""
        return self.series["prompt_n"].total * 1000, self.series["prompt_ms"].total  # token counts kept as µs

    def _cache_fields(self, figures: dict[str, object], ms_per_token: float | None) -> None:
        """The cache figures (analysis/cache.py) into `figures` when any request reused a token; else
        none, so a run with the cache off keeps its summary's shape (its requests' cache_n are all 0).
        Prefill saved is priced at `ms_per_token` (the run's lowest level's), else this level's own."""
        s = self.series
        cached = s["cache_n"].total * 1000  # a _TokenSeries keeps counts as µs
        if not s["cache_n"].count or cached <= 0:
            for key in ("cache_n", "ttft_cache_hit_ms", "ttft_cache_miss_ms"):
                figures[key] = None
            return
        computed = s["prompt_n"].total * 1000
        figures["cache_hit_ratio"] = cache.hit_ratio(cached, computed)
        own = cache.prefill_ms_per_token(computed, s["prompt_ms"].total)
        figures["prefill_saved_ms"] = cache.prefill_saved_ms(cached, own if ms_per_token is None else ms_per_token)

    def _reasoning(self, ttfa: Distribution | None) -> dict[str, Any]:
        """Reasoning's sums (analysis/reasoning.py); none when no request reasoned, so a level of a
        model that does not think keeps the summary's old shape."""
        if not self.reasoning_counted:
            return {"ttfa_ms": None}
        total = self.reasoning_tokens
        return {"reasoning_tokens": total,
                "reasoning_share": total / self.output_tokens if self.output_tokens else None, "ttfa_ms": ttfa}

    def _drafting(self) -> dict[str, Any]:
        """Speculative decoding's sums and rates (analysis/speculation.py); none when no request
        carried draft fields, so a level without speculation keeps the summary's old shape."""
        if not self.drafted_counted:
            return {}
        found = Acceptance(self.draft_n, self.draft_n_accepted, self.output_tokens)
        return {"draft_n": found.drafted, "draft_n_accepted": found.accepted, "acceptance": found.rate,
                "drafted_per_output_token": found.drafted_per_output_token}

    def _achieved_rate(self) -> float | None:
        first, last = self.first_send_ns, self.last_send_ns  # set together, with the first send
        if self.sent < 2 or first is None or last is None or last <= first:
            return None
        return (self.sent - 1) / ((last - first) / 1e9)



def summarize_level(concurrency: int, rs: Sequence[RequestRecord],
                    stopped_reason: str | None = None,
                    server_metrics_delta: dict[str, float] | None = None,
                    rate: float | None = None, percentiles: Sequence[float] = ()) -> LevelSummary:
    """Summarise one level. Failed requests count in the wall time but add no tokens or latency;
    cancelled ones (in flight at Ctrl-C) and lost ones (in flight in a worker process that died)
    count in neither. The figures are gathered as a streamed level gathers them (`LevelAggregate`),
    so both give the same summary."""
    return LevelAggregate.of(rs).summary(concurrency, stopped_reason, server_metrics_delta, rate, percentiles)
