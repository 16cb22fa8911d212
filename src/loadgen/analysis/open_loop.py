"""Does a server keep up with an offered rate? One open-loop level judged on its own (pure).

A closed loop cannot overload a server: C workers wait for their answers. An open loop can, and a
server that cannot keep up does not fail; it answers later and later. One level is enough to tell,
from what was offered and what was served:

- offered_rate = the level's nominal rate (its schedule runs at exactly that rate: run/schedule.py),
  else (n - 1) / (last intended send - first intended send) over its requests.
- served_rate  = (ok - 1) / (last successful completion - first successful completion): answers
  per second while the server was answering (of a streamed level's uniform sample of k records,
  its own rate scaled by ok / k). A server that keeps up answers as the requests come,
  so its completions are spaced like the sends (served ≈ offered, however long each answer takes);
  one that falls behind answers at its own service rate, whatever the offer.
- the backlog's growth: the successful requests in intended-send order, split in thirds; the
  median latency (from the intended send) of the first third and of the last. The backlog grew
  when the last third's median is at least BACKLOG_GROWTH x the first's and longer by more than
  one mean gap between sends (1 / offered_rate: at least one more request waited ahead of it).

The verdict, in this order:
- too_short:  fewer than MIN_REQUESTS successful requests, or no offered rate (every request at once,
              `--rate inf`, has no rate to keep up with): nothing said either way.
- overloaded: served < OVERLOADED_SHARE x offered, or served < KEEPS_UP_SHARE x offered and the
              backlog grew: requests arrive faster than they are answered.
- keeps_up:   served >= KEEPS_UP_SHARE x offered and the backlog did not grow.
- at_limit:   the rest: it served about what was offered, but its backlog grew through the level
              (or it served a little less with no growth seen): at the edge, not keeping up for good.
"Keeps up" is never said of a level whose backlog grew.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.records import RequestRecord

KEEPS_UP_SHARE = 0.9  # served / offered at or above which a level can keep up
OVERLOADED_SHARE = 0.75  # served / offered below which it is overloaded, backlog or not
BACKLOG_GROWTH = 1.5  # last third's median latency / first third's at or above which the backlog grew
MIN_REQUESTS = 6  # successful requests a level needs (two in each third) to be judged

KEEPS_UP = "keeps_up"
AT_LIMIT = "at_limit"
OVERLOADED = "overloaded"
TOO_SHORT = "too_short"


@dataclass(frozen=True, slots=True)
class OpenLoopLevel:
    """One open-loop level's offer, service and backlog, and the verdict they give."""

    level: int | float
    verdict: str  # KEEPS_UP, AT_LIMIT, OVERLOADED or TOO_SHORT
    offered_rate: float | None  # req/s
    served_rate: float | None  # req/s
    requests_ok: int
    latency_first_ms: float | None  # median latency of the first third (by intended send)
    latency_last_ms: float | None  # and of the last third
    backlog_grew: bool
    peak_in_flight: int | None  # the most requests in flight at once (concurrency_reached)
    queue_wait_max_ms: float | None  # the longest a request waited for the server

    @property
    def served_share(self) -> float | None:
        if self.served_rate is None or not self.offered_rate:
            return None
        return self.served_rate / self.offered_rate

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "verdict": self.verdict, "offered_rate": self.offered_rate,
                "served_rate": self.served_rate, "requests_ok": self.requests_ok,
                "latency_first_ms": self.latency_first_ms, "latency_last_ms": self.latency_last_ms,
                "backlog_grew": self.backlog_grew, "peak_in_flight": self.peak_in_flight,
                "queue_wait_max_ms": self.queue_wait_max_ms}


def offered_rate(rate: float | None, rs: Sequence[RequestRecord]) -> float | None:
    """The level's nominal rate, else the rate of its intended sends; None for every request at once."""
    if rate is not None:
        return None if math.isinf(rate) or rate <= 0 else rate
    starts = sorted(r.start_ns for r in rs)
    if len(starts) < 2 or starts[-1] <= starts[0]:
        return None
    return (len(starts) - 1) / ((starts[-1] - starts[0]) / 1e9)


def served_rate(rs: Sequence[RequestRecord], requests_ok: int | None = None) -> float | None:
    """(k - 1) / the span of the k successful completions in `rs`, req/s. `requests_ok`: the level's
    count when `rs` is a uniform sample of its records (a streamed level's): the sample's rate is then
    scaled by requests_ok / k (k - 1 gaps of the sample stand for about requests_ok / k gaps each)."""
    done = [r.complete_ns for r in rs if r.ok]
    if len(done) < 2:
        return None
    span = (max(done) - min(done)) / 1e9
    if span <= 0:
        return None
    k = len(done)
    scale = 1.0 if requests_ok is None or requests_ok <= k else requests_ok / k
    return (k - 1) / span * scale


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]  # the lower middle: metrics.py's rank rule for p50


def latency_thirds_ms(rs: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """The median latency (ms, from the intended send) of the first and of the last third of the
    successful requests in intended-send order; None below MIN_REQUESTS."""
    ok = sorted((r for r in rs if r.ok), key=lambda r: r.start_ns)
    if len(ok) < MIN_REQUESTS:
        return None
    third = len(ok) // 3
    first = [(r.complete_ns - r.start_ns) / 1e6 for r in ok[:third]]
    last = [(r.complete_ns - r.start_ns) / 1e6 for r in ok[-third:]]
    return _median(first), _median(last)


def backlog_grew(first_ms: float | None, last_ms: float | None, offered: float | None) -> bool:
    """The module's rule: the last third waited BACKLOG_GROWTH x the first, and over a mean send gap longer."""
    if first_ms is None or last_ms is None or not offered:
        return False
    return last_ms >= BACKLOG_GROWTH * first_ms and last_ms - first_ms > 1000.0 / offered


def decide(offered: float | None, served: float | None, grew: bool, requests_ok: int) -> str:
    """The verdict from the level's figures (the module's rule)."""
    if offered is None or served is None or requests_ok < MIN_REQUESTS:
        return TOO_SHORT
    share = served / offered
    if share < OVERLOADED_SHARE or (share < KEEPS_UP_SHARE and grew):
        return OVERLOADED
    if share >= KEEPS_UP_SHARE and not grew:
        return KEEPS_UP
    return AT_LIMIT


def judge_level(level: int | float, rate: float | None, rs: Sequence[RequestRecord], *,
                requests_ok: int | None = None, peak_in_flight: int | None = None,
                queue_wait_max_ms: float | None = None) -> OpenLoopLevel:
    """One level judged from its records (all of them, or a uniform sample with the level's
    `requests_ok`)."""
    offered = offered_rate(rate, rs)
    served = served_rate(rs, requests_ok)
    thirds = latency_thirds_ms(rs)
    first, last = thirds if thirds is not None else (None, None)
    grew = backlog_grew(first, last, offered)
    ok = sum(1 for r in rs if r.ok) if requests_ok is None else requests_ok
    return OpenLoopLevel(level, decide(offered, served, grew, ok), offered, served, ok, first, last, grew,
                         peak_in_flight, queue_wait_max_ms)
