"""Is the client the bottleneck? Event-loop lag and client CPU, sampled during a level.

A timer is due every `interval_s` on an absolute schedule; how late it runs (`time.monotonic()` at the
callback - the time it was due) is the loop's lag: a callback that hogs the loop, or a loop that is
never idle, makes it grow, and so does the time every response waits before it is read. Process CPU
time (`time.process_time`, every thread) over wall time is the share of a core the client used.

libuv rounds its timers to whole milliseconds, so an idle uvloop shows up to ~1 ms of lag.

The samples go into an HdrHistogram (`LagFigures`), a few at a time, never into a list that lasts:
a soak samples ~100 times a second for hours (a list of them grew ~12 MB an hour), and its p99 and
max are those `analysis.metrics.distribution_ms` gives of every sample.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from ..analysis.metrics import new_histogram, record_ms

# Above either of these the client, not the server, may be what limits the figures.
LAG_P99_WARN_MS = 2.0
CPU_WARN_FRACTION = 0.90


@dataclass(frozen=True, slots=True)
class ClientLoad:
    loop_lag_p99_ms: float | None  # None: the level was too short for one sample
    loop_lag_max_ms: float | None
    client_cpu_fraction: float  # process CPU seconds / wall seconds (1.0 = one core busy)
    samples: int


class LagFigures:
    """The lag samples' count, p99 and max in bounded memory: each sample is recorded in whole
    microseconds into an HdrHistogram (`analysis.metrics.record_ms`, as `distribution_ms` records
    them), PENDING of them at a time, so the figures are those `distribution_ms` gives of them all."""

    PENDING = 1024

    def __init__(self) -> None:
        self._histogram = new_histogram()
        self._pending: list[float] = []
        self._recorded = 0

    @property
    def samples(self) -> int:
        return self._recorded + len(self._pending)

    def add(self, lag_ms: float) -> None:
        self._pending.append(lag_ms)
        if len(self._pending) >= self.PENDING:
            self._record()

    def clear(self) -> None:
        self._histogram.reset()
        self._pending.clear()
        self._recorded = 0

    def _record(self) -> None:
        if self._pending:
            record_ms(self._histogram, np.asarray(self._pending, dtype=np.float64))
            self._recorded += len(self._pending)
            self._pending.clear()

    def p99_and_max_ms(self) -> tuple[float, float] | None:
        """(p99, max) in ms, as `distribution_ms` reads them off its histogram; None without a sample."""
        self._record()
        if not self._recorded:
            return None
        h = self._histogram
        return h.get_percentile_to_value_dict([50, 90, 99])[99] / 1000, h.get_max_value() / 1000


class LoopLagSampler:
    """Start on a running loop, stop to get a `ClientLoad`. Costs ~100 short callbacks per second."""

    def __init__(self, interval_s: float = 0.010):
        self.interval_s = interval_s
        self._lags = LagFigures()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> LoopLagSampler:
        self._loop = asyncio.get_running_loop()
        self._lags.clear()
        self._cpu0, self._wall0 = time.process_time(), time.monotonic()
        self._due = self._wall0 + self.interval_s
        self._handle = self._loop.call_at(self._loop.time() + self.interval_s, self._tick)
        return self

    def _tick(self) -> None:
        now = time.monotonic()
        self._lags.add(max(0.0, (now - self._due) * 1e3))
        self._due += self.interval_s
        if self._due < now:  # a long stall: sample again one interval from now, not in a burst
            self._due = now + self.interval_s
        self._handle = self._loop.call_at(self._loop.time() + (self._due - now), self._tick)

    def stop(self) -> ClientLoad:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        wall = time.monotonic() - self._wall0
        cpu = time.process_time() - self._cpu0
        lag = self._lags.p99_and_max_ms()
        return ClientLoad(loop_lag_p99_ms=lag[0] if lag else None, loop_lag_max_ms=lag[1] if lag else None,
                          client_cpu_fraction=cpu / wall if wall > 0 else 0.0, samples=self._lags.samples)


def bottleneck_warning(load: ClientLoad, read_clock: str = "loop", advice: str | None = None) -> str | None:
    """One line when the client may have limited the level, else None. `read_clock` is the
    transport's: with kernel receive stamps a busy client still sends late, but times reads right.
    `advice`: what to do instead of the default (more worker processes or a quieter machine)."""
    reasons = []
    if load.loop_lag_p99_ms is not None and load.loop_lag_p99_ms > LAG_P99_WARN_MS:
        reasons.append(f"event-loop lag p99 {load.loop_lag_p99_ms:.2f} ms > {LAG_P99_WARN_MS:g} ms")
    if load.client_cpu_fraction > CPU_WARN_FRACTION:
        reasons.append(f"client CPU {load.client_cpu_fraction:.0%} of a core > {CPU_WARN_FRACTION:.0%}")
    if not reasons:
        return None
    effect = ("requests leave late, so the server gets less load than asked" if read_clock == "kernel"
              else "latencies include its own delay and requests leave late")
    return (f"the client may be the bottleneck ({', '.join(reasons)}): {effect}; "
            + (advice or "use more worker processes (--workers N) or a quieter machine"))


def workers_warning(loads: list[ClientLoad], cores: int, read_clock: str = "loop") -> str | None:
    """One line for a level's worker processes, however many lag: how many of them, the worst one's
    figures, and (when there are more processes than cores, so each lags because they share the
    cores) to use fewer; else None."""
    lagging = [x for x in loads if bottleneck_warning(x, read_clock)]
    if not lagging:
        return None
    worst = max(lagging, key=lambda x: (x.loop_lag_p99_ms or 0.0, x.client_cpu_fraction))
    advice = (f"the {len(loads)} processes share {cores} cores: use fewer (--workers {cores}) or a quieter machine"
              if len(loads) > cores else None)
    return f"{len(lagging)} of {len(loads)} workers: {bottleneck_warning(worst, read_clock, advice)}"
