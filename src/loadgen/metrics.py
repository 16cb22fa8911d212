"""Every derived metric, defined once. Pure functions over recorded data: no I/O, no clock.

Per request (r is a `RequestRecord`; times on the monotonic clock):
- latency_ms     = (r.complete_ns - r.send_ns) / 1e6: client wall time from the request's send
                   to its last response byte. It includes any time the request waited for a slot.
- service_ms     = prompt_ms + predicted_ms: the time the server says it worked on the request
                   (prompt_ms: slot start -> first token; predicted_ms: first -> last token).
- queue_wait_ms  = max(0, latency_ms - service_ms): time the request spent neither in prefill nor
                   in decode by the server's own account: waiting for a free slot (llama-server
                   defers it), plus tokenization and HTTP overhead, which is the floor this figure
                   never drops below (a few ms on loopback).
- decode_tok_s   = the server's timings.predicted_per_second (tokens after the first / predicted_ms).

Per level (the requests of one concurrency level on one target):
- wall_s         = last completion - first send over all of the level's requests.
- output_tokens  = sum of predicted_n over successful requests.
- throughput_tok_s = output_tokens / wall_s: total generated tokens per wall-clock second.
Percentiles come from an HdrHistogram in microseconds with 3 significant digits; means are exact.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hdrh.histogram import HdrHistogram

from . import records
from .records import RequestRecord

HISTOGRAM_LOWEST_US = 1
HISTOGRAM_HIGHEST_US = 3_600 * 1_000_000  # one hour
HISTOGRAM_DIGITS = 3


def latency_ms(r: RequestRecord) -> float:
    """Client wall latency: complete - send."""
    return (r.complete_ns - r.send_ns) / 1e6


def service_ms(r: RequestRecord) -> float | None:
    """Server-side work: prompt_ms + predicted_ms, or None without timings."""
    if r.prompt_ms is None or r.predicted_ms is None:
        return None
    return r.prompt_ms + r.predicted_ms


def queue_wait_ms(r: RequestRecord) -> float | None:
    """max(0, latency - prompt_ms - predicted_ms); None for a failed request or one without timings."""
    service = service_ms(r)
    if not r.ok or service is None:
        return None
    return max(0.0, latency_ms(r) - service)


def decode_tok_s(r: RequestRecord) -> float | None:
    """Per-request decode speed as the server measured it (timings.predicted_per_second)."""
    return r.predicted_per_second if r.ok else None


def level_wall_s(rs: Sequence[RequestRecord]) -> float:
    """First send -> last completion of the level, in seconds (0 when there are no records)."""
    if not rs:
        return 0.0
    return (max(r.complete_ns for r in rs) - min(r.send_ns for r in rs)) / 1e9


def output_tokens(rs: Iterable[RequestRecord]) -> int:
    """Σ predicted_n over successful requests (falls back to tokens_predicted)."""
    total = 0
    for r in rs:
        if r.ok:
            n = r.predicted_n if r.predicted_n is not None else r.tokens_predicted
            total += n or 0
    return total


def throughput_tok_s(rs: Sequence[RequestRecord]) -> float:
    """Σ predicted_n of successful requests / level wall time."""
    wall = level_wall_s(rs)
    return output_tokens(rs) / wall if wall > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    def to_dict(self) -> dict[str, float | int]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90,
                "p99": self.p99, "max": self.max}


def new_histogram() -> HdrHistogram:
    return HdrHistogram(HISTOGRAM_LOWEST_US, HISTOGRAM_HIGHEST_US, HISTOGRAM_DIGITS)


def histogram_ms(values_ms: Iterable[float]) -> HdrHistogram:
    """An HdrHistogram of millisecond values, recorded in whole microseconds."""
    h = new_histogram()
    for v in values_ms:
        us = int(round(v * 1000))
        h.record_value(min(max(us, HISTOGRAM_LOWEST_US), HISTOGRAM_HIGHEST_US))
    return h


def distribution_ms(values_ms: Sequence[float]) -> Distribution | None:
    """Mean (exact) and p50/p90/p99/max (HdrHistogram, µs resolution) of millisecond values."""
    values = [v for v in values_ms if v is not None and math.isfinite(v)]
    if not values:
        return None
    h = histogram_ms(values)
    at = h.get_percentile_to_value_dict([50, 90, 99])  # one walk over the buckets for all three
    return Distribution(
        count=len(values),
        mean=sum(values) / len(values),
        p50=at[50] / 1000,
        p90=at[90] / 1000,
        p99=at[99] / 1000,
        max=h.get_max_value() / 1000,
    )


def _mean(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vs) / len(vs) if vs else None


@dataclass(frozen=True, slots=True)
class LevelSummary:
    """The figures of one concurrency level on one target, as `run.json` stores them."""

    concurrency: int
    requests_ok: int
    requests_failed: int
    requests_cancelled: int
    errors_by_kind: dict[str, int]
    output_tokens: int
    wall_s: float
    throughput_tok_s: float
    latency_ms: Distribution | None
    queue_wait_ms: Distribution | None
    predicted_ms_mean: float | None
    prompt_ms_mean: float | None
    decode_tok_s_mean: float | None
    stopped_reason: str | None = None
    server_metrics_delta: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "requests_cancelled": self.requests_cancelled,
            "errors_by_kind": dict(self.errors_by_kind),
            "output_tokens": self.output_tokens,
            "wall_s": self.wall_s,
            "throughput_tok_s": self.throughput_tok_s,
            "latency_ms": self.latency_ms.to_dict() if self.latency_ms else None,
            "queue_wait_ms": self.queue_wait_ms.to_dict() if self.queue_wait_ms else None,
            "predicted_ms_mean": self.predicted_ms_mean,
            "prompt_ms_mean": self.prompt_ms_mean,
            "decode_tok_s_mean": self.decode_tok_s_mean,
            "stopped_reason": self.stopped_reason,
            "server_metrics_delta": dict(self.server_metrics_delta),
        }


def summarize_level(concurrency: int, rs: Sequence[RequestRecord],
                    stopped_reason: str | None = None,
                    server_metrics_delta: dict[str, float] | None = None) -> LevelSummary:
    """Summarise one level. Failed requests count in the wall time but add no tokens or latency;
    cancelled ones (in flight at Ctrl-C) count in neither."""
    ok = [r for r in rs if r.ok]
    errors = Counter(r.error_kind for r in rs if not r.ok)
    cancelled = errors.pop(records.CANCELLED, 0)
    # Requests cut off by the user are neither the server's failures nor part of the level's wall time.
    rs = [r for r in rs if r.error_kind != records.CANCELLED] if cancelled else rs
    return LevelSummary(
        concurrency=concurrency,
        requests_ok=len(ok),
        requests_failed=sum(errors.values()),
        requests_cancelled=cancelled,
        errors_by_kind=dict(sorted(errors.items())),
        output_tokens=output_tokens(ok),
        wall_s=level_wall_s(rs),
        throughput_tok_s=throughput_tok_s(rs),
        latency_ms=distribution_ms([latency_ms(r) for r in ok]),
        queue_wait_ms=distribution_ms([q for r in ok if (q := queue_wait_ms(r)) is not None]),
        predicted_ms_mean=_mean(r.predicted_ms for r in ok),
        prompt_ms_mean=_mean(r.prompt_ms for r in ok),
        decode_tok_s_mean=_mean(decode_tok_s(r) for r in ok),
        stopped_reason=stopped_reason,
        server_metrics_delta=dict(server_metrics_delta or {}),
    )


def counter_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """after - before for every counter (a `_total` name) both snapshots have; gauges are skipped."""
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in sorted(after) if k in before and k.endswith("_total")}


def prompt_tok_s(r: RequestRecord) -> float | None:
    """Prefill speed of one request as the server measured it: prompt_n / prompt_ms × 1000."""
    if not r.ok or not r.prompt_n or not r.prompt_ms:
        return None
    return r.prompt_n / r.prompt_ms * 1000


@dataclass(frozen=True, slots=True)
class MeanSd:
    """Mean ± sample standard deviation of n values (sd None below two), as llama-bench's -r shows them."""

    n: int
    mean: float
    sd: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "mean": self.mean, "sd": self.sd}


def mean_sd(values: Iterable[float | None]) -> MeanSd | None:
    vs = [v for v in values if v is not None and math.isfinite(v)]
    if not vs:
        return None
    mean = sum(vs) / len(vs)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vs) / (len(vs) - 1)) if len(vs) > 1 else None
    return MeanSd(len(vs), mean, sd)
