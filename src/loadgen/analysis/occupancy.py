"""Where a level's requests were while they waited: queued for a slot, or not yet in the server.

Pure functions over one level's request records (and, as corroboration, the server's probe
samples). A scrape of /metrics or /slots sees one instant every few hundred ms and can miss a short
level's whole queue; the records of a server that sends its own `timings` show every request's
service, so a verdict read from them does not depend on how many scrapes a level happened to get.

Definitions (times on the client's monotonic clock)
- service interval of a completed request = [complete − (prompt_ms + predicted_ms), complete]: the
  server's own account of its work on it, placed at its end (the answer's trip back is small beside it).
- busy slots at t = how many of the level's service intervals contain t. Only loadgen's own requests
  are counted: another client's would hold slots unseen (the scrapes still show those).
- a request's wait = [send + overhead, service start], `overhead` being the fixed cost of HTTP and
  tokenization measured at concurrency 1 (saturation.overhead_ms).
- reached = the earliest time the request can have been in the server's queue: llama-server
  serves its queue first come, first served, so a request that a later one (sent more than 20 ms
  after it, and in a slot more than 20 ms before it) overtook had not reached the queue when that
  one was sent.
- slot wait = the part of the wait after `reached` while every slot was busy (busy ≥ the slot
  count): it waited for a slot, as llama-server defers a task;
  batch wait = the part after `reached` while a slot was free but another request's prompt was
  being computed ([its service start, + prompt_ms]): llama-server takes a new task into a slot only
  between batches, so a request that arrives during a long prefill waits for it, inside the server;
  outside wait = the rest: before it reached the server, or while a slot was free and no prompt was
  being computed: the server had room and had not started the request, so it was not yet in the
  server's hands (an HTTP thread taken by another connection, a connection not yet accepted, a
  long tokenization).
- a request is *held outside* when its outside wait exceeds max(QUEUED_MIN_MS, 10% of its service
  time) (the same bar that makes a request queued) and is the largest part of its wait.
- held-outside stretch: a span of time during which at least one request was held outside; a level
  reports its longest.
Records-based evidence needs the slot count, the server's timings on the level's requests, and all
of the level's records (a streamed level keeps all up to its sample size); without it, the scrapes
decide (`ScrapeEvidence`), and a level with fewer than MIN_SCRAPES of them is too short to tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..core.records import ProbeSample, RequestRecord
from .metrics import service_ms

QUEUED_MIN_MS = 20.0
QUEUED_SERVICE_SHARE = 0.10
# A level judged from scrapes alone needs at least this many of them during its requests.
MIN_SCRAPES = 3
# Requests sent (or started) this close together may reach the server (or a slot) in either order.
OVERTAKE_MARGIN_NS = 20_000_000


@dataclass(frozen=True, slots=True)
class WaitSplit:
    """One request's wait, split by what the server was doing meanwhile (ms)."""

    slot_wait_ms: float
    outside_wait_ms: float
    batch_wait_ms: float = 0.0  # a slot free, but the server busy with another request's prompt


@dataclass(frozen=True, slots=True)
class LevelOccupancy:
    """A level's records-based slot evidence (None where it cannot be had: see the module)."""

    peak_busy_slots: int  # the most service intervals at once
    splits: tuple[WaitSplit | None, ...]  # per record, in the order given (None: failed or no timings)
    held_outside: int  # requests held outside (see the module)
    held_outside_longest_s: float  # the longest stretch with a request held outside
    held_outside_max_ms: float  # the longest outside wait of one request


def service_interval_ns(r: RequestRecord) -> tuple[int, int] | None:
    """[start, end] of the server's work on a completed request, or None without timings."""
    service = service_ms(r)
    if not r.ok or service is None:
        return None
    return r.complete_ns - int(service * 1e6), r.complete_ns


def level_occupancy(records: Sequence[RequestRecord], total_slots: int | None,
                    overhead_ms: float | None) -> LevelOccupancy | None:
    """The records-based evidence of one level, or None when it cannot be had (no slot count, or a
    completed request without timings)."""
    if not total_slots or total_slots < 1:
        return None
    intervals = [service_interval_ns(r) for r in records]
    done = [iv for r, iv in zip(records, intervals) if r.ok]
    if not done or any(iv is None for iv in done):
        return None
    line = _Timeline.of(records, intervals, total_slots)
    lead = int((overhead_ms or 0.0) * 1e6)
    arrived = _arrival_bounds(records, intervals)
    splits: list[WaitSplit | None] = []
    outside_windows: list[tuple[int, int]] = []
    outside_waits: list[float] = []
    for r, iv, here in zip(records, intervals, arrived):
        if iv is None:
            splits.append(None)
            continue
        a, b = r.send_ns + lead, iv[0]
        if b <= a:
            splits.append(WaitSplit(0.0, 0.0))
            continue
        # Before it could have reached the server (overtaken: see _arrival_bounds) it was outside,
        # whatever the slots did; after, the slots and the prompts in progress decide.
        reached = min(max(a, here), b)
        full_ns, batch_ns = line.between(reached, b)
        split = WaitSplit(full_ns / 1e6, (b - a - full_ns - batch_ns) / 1e6, batch_ns / 1e6)
        splits.append(split)
        if held_outside(split, iv):
            outside_windows.append((a, b))
            outside_waits.append(split.outside_wait_ms)
    return LevelOccupancy(
        # Estimated starts can overlap the previous request's end by the answer's trip back: a
        # server never runs more than its slots.
        peak_busy_slots=min(line.peak_busy, total_slots),
        splits=tuple(splits),
        held_outside=len(outside_windows),
        held_outside_longest_s=_longest_union(outside_windows) / 1e9,
        held_outside_max_ms=max(outside_waits, default=0.0),
    )


@dataclass(frozen=True, slots=True)
class _Timeline:
    """A level's busy slots and prompts in progress over time, as cumulative times at breakpoints
    (piecewise linear between them): every slot busy (`full_cum`), and a slot free while another
    request's prompt was being computed (`batch_cum`)."""

    times: np.ndarray
    full_cum: np.ndarray
    batch_cum: np.ndarray
    peak_busy: int

    @classmethod
    def of(cls, records: Sequence[RequestRecord], intervals: Sequence[tuple[int, int] | None],
           total_slots: int) -> _Timeline:
        spans = np.array([iv for iv in intervals if iv is not None], dtype=np.int64)
        prompts = np.array([(iv[0], iv[0] + int((r.prompt_ms or 0.0) * 1e6)) for r, iv in zip(records, intervals)
                            if iv is not None], dtype=np.int64)
        # Two step functions on one time line: busy slots (+1 at each service start, -1 at each
        # end) and prompts in progress (likewise); ends first at a tie, so a slot handed from one
        # request to the next is never counted twice.
        n = len(spans)
        up, down, none = np.ones(n, np.int64), -np.ones(n, np.int64), np.zeros(n, np.int64)
        times = np.concatenate([spans[:, 1], prompts[:, 1], spans[:, 0], prompts[:, 0]])
        slot_steps = np.concatenate([down, none, up, none])
        prompt_steps = np.concatenate([none, down, none, up])
        order = np.lexsort((slot_steps + prompt_steps, times))
        times = times[order]
        busy, prefilling = np.cumsum(slot_steps[order]), np.cumsum(prompt_steps[order])
        full = busy >= total_slots
        batch = ~full & (prefilling > 0)
        seg = np.diff(times)
        return cls(times, np.concatenate([[0], np.cumsum(full[:-1] * seg)]),
                   np.concatenate([[0], np.cumsum(batch[:-1] * seg)]), int(busy.max(initial=0)))

    def between(self, a: int, b: int) -> tuple[float, float]:
        """ns of [a, b] with every slot busy, and with a slot free behind another's prompt."""
        span = float(b - a)
        full = float(np.interp(b, self.times, self.full_cum) - np.interp(a, self.times, self.full_cum))
        full = min(max(full, 0.0), span)
        batch = float(np.interp(b, self.times, self.batch_cum) - np.interp(a, self.times, self.batch_cum))
        return full, min(max(batch, 0.0), span - full)


def _arrival_bounds(records: Sequence[RequestRecord], intervals: Sequence[tuple[int, int] | None]) -> list[int]:
    """For each request, the earliest time it can have reached the server's queue: llama-server
    serves its queue first come, first served, so a request overtaken by one sent more than
    OVERTAKE_MARGIN_NS after it (started in a slot more than OVERTAKE_MARGIN_NS before it) had not
    arrived when that one was sent. Its send time when nothing overtook it."""
    started = sorted((iv[0], r.send_ns) for r, iv in zip(records, intervals) if iv is not None)
    starts = np.array([t for t, _ in started], dtype=np.int64)
    latest_send = np.maximum.accumulate(np.array([s for _, s in started], dtype=np.int64)) if started else starts
    bounds = []
    for r, iv in zip(records, intervals):
        if iv is None:
            bounds.append(r.send_ns)
            continue
        # requests that started well before it (those of one batch step start within a ms or two,
        # in no telling order)
        earlier = int(np.searchsorted(starts, iv[0] - OVERTAKE_MARGIN_NS, "left"))
        overtaker = int(latest_send[earlier - 1]) if earlier else r.send_ns
        bounds.append(overtaker if overtaker - r.send_ns > OVERTAKE_MARGIN_NS else r.send_ns)
    return bounds


def held_outside(split: WaitSplit, interval_ns: tuple[int, int]) -> bool:
    """Held outside the server: an outside wait past the queued bar, and the largest part of the wait."""
    service = (interval_ns[1] - interval_ns[0]) / 1e6
    return (split.outside_wait_ms > max(QUEUED_MIN_MS, QUEUED_SERVICE_SHARE * service)
            and split.outside_wait_ms > split.slot_wait_ms and split.outside_wait_ms > split.batch_wait_ms)


def _longest_union(windows: Sequence[tuple[int, int]]) -> int:
    """The longest span of the union of [a, b) windows, ns."""
    longest = 0
    span: tuple[int, int] | None = None  # the union's current run, [start, end)
    for a, b in sorted(windows):
        if span is None or a > span[1]:
            if span is not None:
                longest = max(longest, span[1] - span[0])
            span = (a, b)
        else:
            span = (span[0], max(span[1], b))
    if span is not None:
        longest = max(longest, span[1] - span[0])
    return longest


@dataclass(frozen=True, slots=True)
class ScrapeEvidence:
    """What a level's scrapes showed, and of the requests loadgen had in flight at each."""

    scrapes: int  # scrapes taken while the level had a request in flight
    peak_busy_slots: int | None
    peak_deferred: float | None
    unheld_longest_s: float  # the longest run of consecutive scrapes at which the server held fewer
    #                          requests (processing + deferred) than loadgen had in flight
    unheld_in_flight: int  # the most requests in flight during that run


def scrape_evidence(records: Sequence[RequestRecord], samples: Sequence[ProbeSample]) -> ScrapeEvidence:
    """The level's scrapes read against its requests in flight at each scrape's time."""
    sends = np.sort(np.array([r.send_ns for r in records], dtype=np.int64))
    ends = np.sort(np.array([r.complete_ns for r in records], dtype=np.int64))
    ordered = sorted(samples, key=lambda s: s.t_ns)
    during = []
    for s in ordered:
        in_flight = int(np.searchsorted(sends, s.t_ns, "right") - np.searchsorted(ends, s.t_ns, "right"))
        if in_flight > 0:
            during.append((s, in_flight))
    busy = [s.busy_slots if s.busy_slots is not None else
            (int(s.requests_processing) if s.requests_processing is not None else None) for s, _ in during]
    deferred = [s.requests_deferred for s, _ in during]
    longest, run_start, run_flight, best_flight = 0, None, 0, 0
    for s, in_flight in during:
        if s.requests_processing is None:
            run_start = None
            continue
        held = s.requests_processing + (s.requests_deferred or 0)
        if held < in_flight:
            if run_start is None:
                run_start, run_flight = s.t_ns, in_flight
            run_flight = max(run_flight, in_flight)
            if s.t_ns - run_start > longest:
                longest, best_flight = s.t_ns - run_start, run_flight
        else:
            run_start = None
    return ScrapeEvidence(
        scrapes=len(during),
        peak_busy_slots=max((b for b in busy if b is not None), default=None),
        peak_deferred=max((d for d in deferred if d is not None), default=None),
        unheld_longest_s=longest / 1e9,
        unheld_in_flight=best_flight,
    )
