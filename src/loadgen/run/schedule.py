"""Open-loop arrival schedules: when each request of a level should be sent.

Computed up front as offsets from the level's start on the monotonic clock, so the sender never
drifts (each send aims at an absolute time, not at "a sleep after the previous one"), and so every
latency can be measured from the time the request *should* have left: a server that stalls cannot
hide behind a client that stalled with it (coordinated omission).

- constant: offsets i / rate.
- poisson:  exponential gaps with mean 1 / rate (memoryless arrivals, like independent users).
- gamma:    gamma-distributed gaps with shape k = burstiness and mean 1 / rate; k = 1 is Poisson,
            k < 1 burstier (clumps and lulls), k > 1 more regular.

- rate inf (`--rate inf`): every request at offset 0, all at once; it needs a request count.

A level sends n requests: `requests`, or with only a duration the n offsets i / rate below it (the
constant schedule's count, the expected count of the others), whichever is fewer. The n - 1 drawn
gaps are then rescaled so that their mean is exactly 1 / rate: every level's schedule runs at its
nominal rate ((n - 1) / last offset = rate), however few its requests. Without this the same seed's
unit gaps, a sample whose mean is off by chance, were reused at every rate, and every level ran
that many percent off (5 req/s got 3.8). Rescaling keeps the process's shape: exponential gaps
scaled to a fixed sum are the Poisson process conditioned on its n-th arrival (arrivals uniform
in the span), gamma gaps the gamma renewal process so conditioned; only the run-to-run spread of
the count over a span is gone, which is what a benchmark wants. n = 2 leaves one gap of exactly
1 / rate; the first request goes at offset 0.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where offsets are drawn: `loadgen sweep --help` reads ARRIVALS without it
    import numpy as np

ARRIVALS = ("constant", "poisson", "gamma")


def arrival_offsets_ns(rate: float, *, requests: int | None, duration_s: float | None,
                       arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send offsets (ns from the level's start, int64, non-decreasing) for one level.

    `requests` bounds the count, `duration_s` the span (offsets < duration); with both, whichever
    ends first. The first request goes at offset 0; the mean gap is exactly 1 / rate.
    """
    import numpy as np

    if rate <= 0 or np.isnan(rate):
        raise ValueError("rate must be a positive number of requests per second")
    if requests is None and duration_s is None:
        raise ValueError("a level needs a request count or a duration")
    if math.isinf(rate):  # --rate inf: every request at offset 0, whatever the arrival process
        if requests is None:
            raise ValueError("a level at rate inf needs a request count")
        return np.zeros(requests, dtype=np.int64)
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}")
    if arrival == "gamma" and burstiness <= 0:
        raise ValueError("burstiness must be positive")
    if duration_s is not None:
        limit_ns = round(duration_s * 1e9)
        # how many of the offsets i / rate fall below the duration: the constant schedule's count
        candidates = np.round(np.arange(int(np.ceil(duration_s * rate)) + 1) / rate * 1e9)
        in_span = int(np.count_nonzero(candidates < limit_ns))
        n = in_span if requests is None else min(requests, in_span)
    else:
        assert requests is not None  # one of the two is given: checked above
        n = requests
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if arrival == "constant":
        offsets = np.arange(n) / rate
    else:
        rng = np.random.default_rng(seed)
        shape = 1.0 if arrival == "poisson" else burstiness
        gaps = rng.gamma(shape, 1.0 / shape, size=n - 1)  # unit mean
        total = gaps.sum()
        # rescaled: the n - 1 gaps span exactly (n - 1) / rate (see the module's docstring)
        gaps = gaps * ((n - 1) / rate / total) if total > 0 else np.full(n - 1, 1.0 / rate)
        offsets = np.concatenate([[0.0], np.cumsum(gaps)])
    ns = np.round(offsets * 1e9).astype(np.int64)
    if duration_s is not None:
        ns = ns[ns < limit_ns]  # a rounding at the very edge; (n - 1) / rate < duration by n's choice
    return ns


def connections_ahead(concurrency: int, rate: float | None, *, requests: int | None,
                      latency_s: float | None) -> int:
    """How many connections to open before a level's clock starts (see `Transport.connect_ahead`).

    Closed loop: its concurrency (at most its request budget). Open loop: what it will hold in
    flight by Little's law, rate × latency, doubled for the bursts of a random schedule, plus one;
    `latency_s` is the latency seen so far (warm-up, earlier levels), and without one a single
    connection. `concurrency` is then the in-flight cap (0: none); the pool opens more if needed.
    """
    if rate is None:
        want = concurrency
    elif math.isinf(rate):  # --rate inf: every request at once, so a connection each (up to the cap)
        want = requests if requests is not None else 1
        if concurrency > 0:
            want = min(want, concurrency)
    else:
        want = 1 if not latency_s else math.ceil(2 * rate * latency_s) + 1
        if concurrency > 0:
            want = min(want, concurrency)
    return max(0, want if requests is None else min(want, requests))
