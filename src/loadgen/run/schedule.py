"""Open-loop arrival schedules: when each request of a level should be sent.

Computed up front as offsets from the level's start on the monotonic clock, so the sender never
drifts (each send aims at an absolute time, not at "a sleep after the previous one"), and so every
latency can be measured from the time the request *should* have left: a server that stalls cannot
hide behind a client that stalled with it (coordinated omission).

- constant: offsets i / rate.
- poisson:  exponential gaps with mean 1 / rate (memoryless arrivals, like independent users).
- gamma:    gamma-distributed gaps with shape k = burstiness and mean 1 / rate; k = 1 is Poisson,
            k < 1 burstier (clumps and lulls), k > 1 more regular.
"""

from __future__ import annotations

import numpy as np

ARRIVALS = ("constant", "poisson", "gamma")


def arrival_offsets_ns(rate: float, *, requests: int | None, duration_s: float | None,
                       arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0) -> np.ndarray:
    """Send offsets (ns from the level's start, int64, non-decreasing) for one level.

    `requests` bounds the count, `duration_s` the span (offsets < duration); with both, whichever
    ends first. The first request goes at offset 0.
    """
    if rate <= 0 or not np.isfinite(rate):
        raise ValueError("rate must be a positive number of requests per second")
    if requests is None and duration_s is None:
        raise ValueError("a level needs a request count or a duration")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}")
    if arrival == "gamma" and burstiness <= 0:
        raise ValueError("burstiness must be positive")
    n = requests if requests is not None else int(np.ceil(duration_s * rate * 1.5)) + 16
    mean_gap = 1.0 / rate
    if arrival == "constant":
        offsets = np.arange(n) / rate
        if duration_s is not None and requests is None:
            offsets = np.arange(int(np.ceil(duration_s * rate)) + 1) / rate
    else:
        rng = np.random.default_rng(seed)
        shape = 1.0 if arrival == "poisson" else burstiness

        def draw(k: int) -> np.ndarray:
            return rng.gamma(shape, mean_gap / shape, size=k)

        gaps = draw(n)
        gaps[0] = 0.0
        offsets = np.cumsum(gaps)
        while duration_s is not None and requests is None and offsets[-1] < duration_s:  # a long draw: extend
            offsets = np.concatenate([offsets, offsets[-1] + np.cumsum(draw(n))])
    ns = np.round(offsets * 1e9).astype(np.int64)
    if duration_s is not None:
        ns = ns[ns < round(duration_s * 1e9)]
    return ns[:requests] if requests is not None else ns
