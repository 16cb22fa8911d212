"""Is the client the bottleneck? Event-loop lag and client CPU, sampled during a level.

A timer is due every `interval_s` on an absolute schedule; how late it runs (`time.monotonic()` at the
callback - the time it was due) is the loop's lag: a callback that hogs the loop, or a loop that is
never idle, makes it grow, and so does the time every response waits before it is read. Process CPU
time (`time.process_time`, every thread) over wall time is the share of a core the client used.

libuv rounds its timers to whole milliseconds, so an idle uvloop shows up to ~1 ms of lag.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..analysis.metrics import distribution_ms

# Above either of these the client, not the server, may be what limits the figures.
LAG_P99_WARN_MS = 2.0
CPU_WARN_FRACTION = 0.90


@dataclass(frozen=True, slots=True)
class ClientLoad:
    loop_lag_p99_ms: float | None  # None: the level was too short for one sample
    loop_lag_max_ms: float | None
    client_cpu_fraction: float  # process CPU seconds / wall seconds (1.0 = one core busy)
    samples: int


class LoopLagSampler:
    """Start on a running loop, stop to get a `ClientLoad`. Costs ~100 short callbacks per second."""

    def __init__(self, interval_s: float = 0.010):
        self.interval_s = interval_s
        self._lags_ms: list[float] = []
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> LoopLagSampler:
        self._loop = asyncio.get_running_loop()
        self._lags_ms.clear()
        self._cpu0, self._wall0 = time.process_time(), time.monotonic()
        self._due = self._wall0 + self.interval_s
        self._handle = self._loop.call_at(self._loop.time() + self.interval_s, self._tick)
        return self

    def _tick(self) -> None:
        now = time.monotonic()
        self._lags_ms.append(max(0.0, (now - self._due) * 1e3))
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
        lag = distribution_ms(self._lags_ms)
        return ClientLoad(loop_lag_p99_ms=lag.p99 if lag else None, loop_lag_max_ms=lag.max if lag else None,
                          client_cpu_fraction=cpu / wall if wall > 0 else 0.0, samples=len(self._lags_ms))


def bottleneck_warning(load: ClientLoad, read_clock: str = "loop") -> str | None:
    """One line when the client may have limited the level, else None. `read_clock` is the
    transport's: with kernel receive stamps a busy client still sends late, but times reads right."""
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
            "use more worker processes (--workers N) or a quieter machine")
