"""A level's metrics and the histograms behind every percentile. Pure functions over recorded data:
no I/O, no clock.

Per request: every metric (latency_ms, ttft_ms, tpot_ms, itl_ms, queue_wait_ms, ...) is one
`Metric` of analysis/metric_defs.py, its per-record and vectorised definitions side by side; the
per-record functions are named here too, for the readers of one record. A helper of theirs:
- service_ms     = prompt_ms + predicted_ms: the time the server says it worked on the request
                   (prompt_ms: slot start -> first token; predicted_ms: first -> last token).

Per level (the requests of one concurrency level on one target):
- wall_s         = last completion - first (intended) send over all of the level's requests.
- output_tokens  = sum of the server's token counts over successful requests: timings.predicted_n,
                   else tokens_predicted, else usage.completion_tokens (never the chunk count).
- throughput_tok_s = output_tokens / wall_s: total generated tokens per wall-clock second.
- input_tokens   = sum of input_tokens(r) over successful requests: the prompt's tokens as the
                   server counted them, timings.prompt_n + timings.cache_n (processed + reused
                   from the cache), else usage.prompt_tokens.
- request_rate   = successful requests / wall_s (req/s).
- total_tok_s    = (input_tokens + output_tokens) / wall_s: prompt and generated tokens per second.
- achieved_rate  = (n - 1) / (last actual send - first actual send) over the level's n sent
                   requests (cancelled ones too: they left), req/s: the rate the open-loop level
                   actually offered, beside its nominal `rate` (a late client or --max-in-flight
                   lowers it). None in closed loop or below two sends.
- concurrency_reached = the most requests in flight at once: the peak over time t of the number of
                   requests with send_ns <= t < complete_ns (every sent request, cancelled ones too;
                   one that completes at the instant another is sent does not overlap it). A closed
                   loop of C workers reaches C unless its budget or its target ended it first.
- connections_opened = how many of the level's requests opened their connection (r.connect_us is
                   not None): a server that closes after every response (llama-server after a
                   stream) makes each request pay for one; a keep-alive server none, since
                   loadgen opens the level's connections before its clock starts.
Percentiles come from an HdrHistogram in microseconds with 3 significant digits; means are exact.
The q-th percentile of n values is the value of rank max(1, round(q·n)) in sorted order (no
interpolation: the p50 of two values is the lower), given as its bucket's highest equivalent value.
Every output (progress line, tables, reports, run.json) shows these, never statistics.median.
A level's figures are a `core.rundoc.LevelSummary`, the one schema of a level in run.json.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.ctypeslib  # noqa: F401  # at import: numpy loads it lazily, which fails once the sockets of a run hold every open file
from hdrh.histogram import HdrHistogram

from ..core.records import RequestRecord
from ..core.rundoc import Distribution

# The per-request formulas live beside their vectorised twins in metric_defs.py; named here too,
# where every one-record reader has always found them.
from .metric_defs import (  # noqa: F401  # re-exported: the one-record readers import them here
    decode_tok_s,
    input_tokens,
    itl_ms,
    latency_ms,
    latency_uncorrected_ms,
    prompt_tok_s,
    queue_wait_ms,
    schedule_lag_ms,
    service_ms,
    tpot_ms,
    ttfa_ms,
    ttft_ms,
    ttft_queue_ms,
)

HISTOGRAM_LOWEST_US = 1
HISTOGRAM_HIGHEST_US = 3_600 * 1_000_000  # one hour
HISTOGRAM_DIGITS = 3


def level_wall_s(rs: Sequence[RequestRecord]) -> float:
    """First send -> last completion of the level, in seconds (0 when there are no records)."""
    if not rs:
        return 0.0
    return (max(r.complete_ns for r in rs) - min(r.start_ns for r in rs)) / 1e9


def output_tokens(rs: Iterable[RequestRecord]) -> int:
    """Σ predicted_n over successful requests (else tokens_predicted, else usage.completion_tokens)."""
    return sum(r.output_tokens or 0 for r in rs if r.ok)


def throughput_tok_s(rs: Sequence[RequestRecord]) -> float:
    """Σ predicted_n of successful requests / level wall time."""
    wall = level_wall_s(rs)
    return output_tokens(rs) / wall if wall > 0 else 0.0


def achieved_rate(rs: Sequence[RequestRecord]) -> float | None:
    """(n - 1) / (last send - first send) in req/s: the mean gap between actual sends, inverted."""
    if len(rs) < 2:
        return None
    first, last = min(r.send_ns for r in rs), max(r.send_ns for r in rs)
    return (len(rs) - 1) / ((last - first) / 1e9) if last > first else None
def concurrency_reached(rs: Iterable[RequestRecord]) -> int:
    """The peak number of requests in flight at once, from their send and completion times (0: none)."""
    # At equal times a completion (-1) sorts before a send (+1): back-to-back requests do not overlap.
    events = sorted([(r.send_ns, 1) for r in rs] + [(r.complete_ns, -1) for r in rs])
    peak = in_flight = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    return peak


def new_histogram() -> HdrHistogram:
    return HdrHistogram(HISTOGRAM_LOWEST_US, HISTOGRAM_HIGHEST_US, HISTOGRAM_DIGITS)


def histogram_ms(values_ms: Iterable[float]) -> HdrHistogram:
    """An HdrHistogram of millisecond values, recorded in whole microseconds (see `record_ms`)."""
    h = new_histogram()
    record_ms(h, values_ms)
    return h


def record_ms(h: HdrHistogram, values_ms: Iterable[float]) -> None:
    """Record millisecond values into `h` in whole microseconds (rounded; see `record_us`)."""
    values = values_ms if isinstance(values_ms, np.ndarray) else np.fromiter(values_ms, dtype=np.float64)
    record_us(h, np.rint(values.astype(np.float64) * 1000))


def record_us(h: HdrHistogram, values_us: np.ndarray) -> None:
    """Record whole-microsecond values into `h`, clipped to its range.

    Each value's counts index (HdrHistogram's bucket and sub-bucket) is computed with numpy and
    counted with one `bincount`, and the counts are added to the histogram's counts array in one
    numpy step (the hdrhistogram package keeps them in a ctypes array; `record_value(v, count)` per
    occupied bucket, v its lowest value, where it does not): the histogram one `record_value` per
    value gives, at a fraction of the cost (a level of a fast server holds 100k+ requests, and a
    streamed one 64 ITL values per request), without sorting the values.
    """
    if values_us.size == 0:
        return
    us = np.clip(values_us, HISTOGRAM_LOWEST_US, HISTOGRAM_HIGHEST_US).astype(np.int64)
    half, unit = h.sub_bucket_half_count_magnitude, h.unit_magnitude
    # The bucket of v (2**(half+1) sub-buckets, the first bucket's unit 2**unit) is
    # max(0, floor(log2 v) - half - unit); frexp gives floor(log2 v) exactly: v = m * 2**e, 0.5 <= m < 1.
    bucket = np.maximum(0, np.frexp(us.astype(np.float64))[1] - 1 - (half + unit))
    index = ((bucket + 1) << half) + (us >> (bucket + unit)) - (1 << half)
    counts = np.bincount(index)
    occupied = np.flatnonzero(counts)
    bucket = np.maximum(0, (occupied >> half) - 1)
    lowest = (occupied - ((bucket + 1) << half) + (1 << half)) << (bucket + unit)
    view = _counts_array(h)
    if view is not None and occupied[-1] < view.size:
        view[occupied] += counts[occupied].astype(view.dtype)
        h.total_count += int(us.size)  # what record_value keeps besides the counts
        h.min_value = min(h.min_value, int(lowest[0]))
        h.max_value = max(h.max_value, int(lowest[-1]))
        return
    record = h.record_value
    for v, c in zip(lowest.tolist(), counts[occupied].tolist()):
        record(v, c)


def occupied_counts(h: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    """The histogram's occupied counts indexes and their counts (what `add_counts` adds back)."""
    view = _counts_array(h)
    if view is None:
        counts = np.array([h.get_count_at_index(i) for i in range(h.counts_len)], dtype=np.int64)
    else:
        counts = view.astype(np.int64)
    occupied = np.flatnonzero(counts)
    return occupied, counts[occupied]


def add_counts(h: HdrHistogram, index: np.ndarray, counts: np.ndarray, min_value: int, max_value: int) -> None:
    """Add to `h` what `occupied_counts` read from a histogram of the same layout whose lowest and
    highest recorded values were `min_value` and `max_value`: `h.add` of that histogram, with no
    histogram made (a worker process sends its few occupied buckets, not the array of them all)."""
    if index.size == 0:
        return
    view = _counts_array(h)
    if view is not None and int(index[-1]) < view.size:
        view[index] += counts.astype(view.dtype)
        h.total_count += int(counts.sum())
        h.min_value, h.max_value = min(h.min_value, min_value), max(h.max_value, max_value)
        return
    half, unit = h.sub_bucket_half_count_magnitude, h.unit_magnitude
    bucket = np.maximum(0, (index >> half) - 1)
    lowest = (index - ((bucket + 1) << half) + (1 << half)) << (bucket + unit)
    for v, c in zip(lowest.tolist(), counts.tolist()):
        h.record_value(v, c)


def clear_histogram(h: HdrHistogram) -> None:
    """Empty `h` as `h.reset()` does, in one numpy step where it can (reset walks its counts one by
    one). Reusing a histogram also spares the garbage collector: each one is a reference cycle
    holding its counts array (190 KB here), freed only by a full collection."""
    view = _counts_array(h)
    if view is None:
        h.reset()
        return
    view[:] = 0
    h.total_count, h.min_value, h.max_value = 0, sys.maxsize, 0


def _counts_array(h: HdrHistogram) -> np.ndarray | None:
    """The histogram's counts as a numpy array sharing their memory, or None if they are not held
    in a ctypes array of counts_len unsigned integers."""
    counts = getattr(h, "counts", None)
    if not isinstance(counts, ctypes.Array) or len(counts) != h.counts_len:
        return None
    view = np.ctypeslib.as_array(counts)
    return view if view.dtype.kind == "u" else None


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


def counter_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float]:
    """after - before for every counter (a `_total` name) both snapshots have; gauges are skipped."""
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in sorted(after) if k in before and k.endswith("_total")}


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
