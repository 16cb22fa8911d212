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

import bisect
import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence

from hdrh.histogram import HdrHistogram

from ..core import records
from ..core.records import LevelRun, RequestRecord
from ..core.rundoc import Distribution, LevelSummary
from . import metrics

SAMPLE_SIZE = 2000

# Every histogram a level keeps, by the name the exporters use (see output/exporters.py).
HISTOGRAMS = ("latency", "latency_uncorrected", "queue_wait", "predicted_ms", "ttft", "ttft_queue", "tpot", "itl",
              "schedule_lag")


class _Series:
    """Count, exact sum and HdrHistogram of one metric's millisecond values."""

    __slots__ = ("count", "total", "histogram")

    def __init__(self) -> None:
        self.count, self.total, self.histogram = 0, 0.0, metrics.new_histogram()

    def add(self, values_ms: list[float]) -> None:
        values = [v for v in values_ms if math.isfinite(v)]
        if values:
            self.count += len(values)
            self.total += sum(values)
            metrics.record_ms(self.histogram, values)

    def distribution(self) -> Distribution | None:
        if not self.count:
            return None
        h = self.histogram
        at = h.get_percentile_to_value_dict([50, 90, 99])
        return Distribution(count=self.count, mean=self.total / self.count, p50=at[50] / 1000, p90=at[90] / 1000,
                            p99=at[99] / 1000, max=h.get_max_value() / 1000)


class _Mean:
    __slots__ = ("count", "total")

    def __init__(self) -> None:
        self.count, self.total = 0, 0.0

    def add(self, values: Iterable[float | None]) -> None:
        vs = [v for v in values if v is not None and math.isfinite(v)]
        self.count += len(vs)
        self.total += sum(vs)

    def value(self) -> float | None:
        return self.total / self.count if self.count else None


def of_level(level: LevelRun) -> "LevelAggregate":
    """A level's aggregate: the one it streamed into, else one gathered from its records."""
    return level.aggregate if level.aggregate is not None else LevelAggregate.of(level.records)


class LevelAggregate:
    """Streaming figures of one level; see the module docstring."""

    def __init__(self, sample_size: int = SAMPLE_SIZE) -> None:
        self.series = {name: _Series() for name in HISTOGRAMS}
        self.means = {name: _Mean() for name in ("predicted_ms", "prompt_ms", "decode_tok_s")}
        self.errors: Counter[str] = Counter()
        self.sent = self.ok = self.output_tokens = 0
        self.first_start_ns: int | None = None  # non-cancelled requests: the level's wall time
        self.last_complete_ns: int | None = None
        self.first_send_ns: int | None = None  # every sent request: the achieved rate
        self.last_send_ns: int | None = None
        self.any_scheduled = False  # a request whose intended send differs from its actual one
        self.sample: list[RequestRecord] = []
        self._sample_size, self._random = sample_size, random.Random(0)
        self._events: list[tuple[int, int]] = []  # (time, +1 send / -1 completion) not yet swept
        self._in_flight = self._peak = 0

    @classmethod
    def of(cls, rs: Iterable[RequestRecord]) -> "LevelAggregate":
        agg = cls()
        agg.add_batch(list(rs))
        return agg

    def add_batch(self, batch: Sequence[RequestRecord]) -> None:
        if not batch:
            return
        self._count(batch)
        ok = [r for r in batch if r.error_kind is None]
        counted = [r for r in batch if r.error_kind != records.CANCELLED]
        self._distributions(ok, counted)
        m = self.means
        m["predicted_ms"].add(r.predicted_ms for r in ok)
        m["prompt_ms"].add(r.prompt_ms for r in ok)
        m["decode_tok_s"].add(r.predicted_per_second for r in ok)
        self._sample(batch)

    def _count(self, batch: Sequence[RequestRecord]) -> None:
        self.sent += len(batch)
        errors = self.errors
        tokens = ok = 0
        for r in batch:
            if r.error_kind is None:
                ok += 1
                tokens += r.output_tokens or 0
            else:
                errors[r.error_kind] += 1
        self.ok += ok
        self.output_tokens += tokens
        sends = [r.send_ns for r in batch]
        self.first_send_ns = min(sends) if self.first_send_ns is None else min(self.first_send_ns, *sends)
        self.last_send_ns = max(sends) if self.last_send_ns is None else max(self.last_send_ns, *sends)
        counted = [r for r in batch if r.error_kind != records.CANCELLED]
        if counted:
            start = min(r.start_ns for r in counted)
            end = max(r.complete_ns for r in counted)
            self.first_start_ns = start if self.first_start_ns is None else min(self.first_start_ns, start)
            self.last_complete_ns = end if self.last_complete_ns is None else max(self.last_complete_ns, end)
        self.any_scheduled = self.any_scheduled or any(r.intended_ns not in (None, r.send_ns) for r in batch)
        events = self._events
        for r in batch:
            events.append((r.send_ns, 1))
            events.append((r.complete_ns, -1))

    def _distributions(self, ok: list[RequestRecord], counted: list[RequestRecord]) -> None:
        s = self.series
        s["latency"].add([metrics.latency_ms(r) for r in ok])
        s["latency_uncorrected"].add([metrics.latency_uncorrected_ms(r) for r in ok])
        s["queue_wait"].add([q for r in ok if (q := metrics.queue_wait_ms(r)) is not None])
        s["predicted_ms"].add([r.predicted_ms for r in ok if r.predicted_ms is not None])
        s["schedule_lag"].add([metrics.schedule_lag_ms(r) for r in counted])
        streamed = [r for r in ok if r.first_token_ns is not None or r.chunk_gaps_us]
        if streamed:
            s["ttft"].add([v for r in streamed if (v := metrics.ttft_ms(r)) is not None])
            s["ttft_queue"].add([v for r in streamed if (v := metrics.ttft_queue_ms(r)) is not None])
            s["tpot"].add([v for r in streamed if (v := metrics.tpot_ms(r)) is not None])
            s["itl"].add([g for r in streamed for g in metrics.itl_ms(r)])

    def _sample(self, batch: Sequence[RequestRecord]) -> None:
        sample, size = self.sample, self._sample_size
        seen = self.sent - len(batch)
        for r in batch:
            seen += 1
            if len(sample) < size:
                sample.append(r)
            else:
                j = self._random.randrange(seen)
                if j < size:
                    sample[j] = r

    def settle(self, watermark_ns: int | None = None) -> None:
        """Sweep the send/completion events before `watermark_ns` (None: all) into the peak."""
        events = self._events
        events.sort()  # at equal times a completion (-1) sorts before a send: back to back is no overlap
        cut = len(events) if watermark_ns is None else bisect.bisect_left(events, (watermark_ns, -1))
        in_flight, peak = self._in_flight, self._peak
        for _, step in events[:cut]:
            in_flight += step
            if in_flight > peak:
                peak = in_flight
        self._in_flight, self._peak = in_flight, peak
        del events[:cut]

    def concurrency_reached(self) -> int:
        """The peak so far, the events not yet settled included (not consumed)."""
        in_flight, peak = self._in_flight, self._peak
        for _, step in sorted(self._events):
            in_flight += step
            peak = max(peak, in_flight)
        return peak

    def histogram(self, name: str) -> HdrHistogram:
        return self.series[name].histogram

    def summary(self, concurrency: int, stopped_reason: str | None = None,
                server_metrics_delta: dict[str, float] | None = None, rate: float | None = None) -> LevelSummary:
        """The level's `LevelSummary` (see `metrics.summarize_level` for what counts where)."""
        errors = Counter(dict(self.errors))  # a copy in one step: a checkpoint reads from another thread
        cancelled = errors.pop(records.CANCELLED, 0)
        wall = 0.0 if self.first_start_ns is None else (self.last_complete_ns - self.first_start_ns) / 1e9
        s = self.series
        return LevelSummary(
            level=concurrency if rate is None else rate, concurrency=concurrency,
            concurrency_reached=self.concurrency_reached(), requests_ok=self.ok,
            requests_failed=sum(errors.values()), requests_cancelled=cancelled,
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
        )

    def _achieved_rate(self) -> float | None:
        if self.sent < 2 or self.last_send_ns <= self.first_send_ns:
            return None
        return (self.sent - 1) / ((self.last_send_ns - self.first_send_ns) / 1e9)

