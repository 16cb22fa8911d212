"""Why a server stops scaling: slot saturation, the deferred queue and batching gain.

Pure functions over recorded data (level summaries, request records, probe samples): a saved run
gives the same verdicts as a live one.

Definitions
- overhead_ms: the median raw queue wait at concurrency 1 on the same target. With one request in
  flight nothing waits for a slot, so what remains of latency - prompt_ms - predicted_ms there is
  the fixed cost of tokenization and HTTP.
- corrected queue wait = max(0, raw queue wait - overhead_ms).
- a request is *queued* when its corrected queue wait > max(20 ms, 10% of its service time).
- knee (the saturation point), judged step by step up the ladder of full levels, each step from a
  level P to the next level N of relative size s = N/P - 1 (1 for a doubling), against the best
  throughput so far B (the highest of the levels up to P):
  * the step is *flat* when throughput(N) < B x (1 + knee_gain x s): less than a tenth of what
    linear scaling would add (10% for a doubling, 5% for x1.5, 30% for x4);
  * the step *saturates* when it is flat, or when N ran out of slots (slots_exhausted: most of its
    requests waited for a slot), and in either case mean latency, less any wait outside the server
    (occupancy.py), rose by more than knee_latency x min(s, 1) (x1.5 for a doubling or more, x1.25
    for x1.5; on a saturated closed loop latency grows like the concurrency, Little's law, so a
    real knee clears this by a wide margin).
  The first saturating step places the knee, unless it was flat without the slot evidence and a
  later level beats it by more than knee_gain (a dip on a noisy machine is not a plateau). Where N
  ran out of slots and P's records show no request waiting for one, the slots place it: at or above
  P, below N, whatever throughput did (a short level's throughput is noisy; its slot evidence is
  not). Otherwise a flat step that gained < knee_gain puts it at or below P; one that still gained
  puts it above P, at or below N. When the ladder pins it (neighbouring concurrencies, or the
  bracket's end is the slot count) the knee is *at* that level; otherwise it lies *between* two
  tested levels and the verdict says so. A ladder whose first level is already saturated (and
  above concurrency 1) puts the knee at or below that level. `saturated_at` is the knee when
  exact, else the lowest tested level known to be saturated. One level alone places no knee: its
  verdict says what its slots showed.
- why queued requests waited (queue_cause): see occupancy.py; from the records' own timings where
  the slot count is known, else from the scrapes, and "too short to tell" with fewer than 3.
- batching gain at C: throughput at C / throughput at concurrency 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec

from ..core.records import CLIENT_SIDE, ProbeSample, RequestRecord, level_short
from ..core.rundoc import Distribution, LevelSummary
from .evidence import LevelFigures, completed_any, has_completed, no_verdict_line
from .metrics import distribution_ms, queue_wait_ms, service_ms
from .occupancy import (
    MIN_SCRAPES,
    QUEUED_MIN_MS,
    QUEUED_SERVICE_SHARE,
    LevelOccupancy,
    ScrapeEvidence,
    level_occupancy,
    scrape_evidence,
)
from .open_loop import AT_LIMIT, KEEPS_UP, KEEPS_UP_SHARE, OVERLOADED, OpenLoopLevel, judge_level

UNTRUSTED_FAILURE_SHARE = 0.05
# A request the server had not taken in for longer than this (the probe's default interval) while a
# slot was free is named as held by the HTTP layer (occupancy.py), with the fix.
HTTP_HOLD_MS = 250.0

# Why a level's queued requests waited (LevelQueueing.queue_cause).
SLOTS = "slots"  # for a slot: every slot was busy meanwhile (records), or the server showed it (scrapes)
OUTSIDE = "outside"  # with a slot free: not yet in the server's hands
BATCH = "prefill"  # with a slot free, behind another request's prompt being computed (records only)
TOO_SHORT = "too_short"  # neither: no records evidence and too few scrapes to tell
UNKNOWN = "unknown"  # the server shows neither /metrics, /slots nor timings


@dataclass(frozen=True, slots=True)
class LevelPoint:
    """The per-level figures the knee rule reads."""

    level: int | float  # concurrency, or offered rate in open loop
    throughput_tok_s: float
    latency_mean_ms: float | None


@dataclass(frozen=True, slots=True)
class Knee:
    at: int | float  # level (concurrency or rate) where the server saturates (see `between`)
    next_level: int | float  # the level whose step showed it
    throughput_gain: float  # relative, against the best level so far: +0.02 is +2%
    latency_ratio: float  # ×2.1
    between: tuple[int | float, int | float] | None = None  # the knee lies in this range of untested levels
    at_or_below: bool = False  # the ladder's first level was already saturated: the knee may be lower

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "next_level": self.next_level, "throughput_gain": self.throughput_gain,
                "latency_ratio": self.latency_ratio,
                "between": None if self.between is None else list(self.between), "at_or_below": self.at_or_below}


@dataclass(frozen=True, slots=True)
class LevelQueueing:
    level: int | float
    requests: int
    queued: int
    queued_share: float
    queue_wait_raw_ms: Distribution | None
    queue_wait_ms: Distribution | None  # overhead-corrected
    queued_wait_ms: Distribution | None  # corrected waits of the queued requests only
    peak_deferred: float | None
    peak_busy_slots: int | None
    batching_gain: float | None
    failure_share: float
    # Why the queued requests waited (SLOTS, OUTSIDE, TOO_SHORT, UNKNOWN; None: none queued) and
    # from what evidence ("records": the requests' own timings, occupancy.py; "scrapes": the probe).
    queue_cause: str | None = None
    evidence: str = "scrapes"
    slot_queued: int = 0  # queued requests that waited for a slot
    slot_wait_ms: Distribution | None = None  # their waits while every slot was busy: the queue net of the rest
    held_outside: int = 0  # requests held outside the server while a slot was free (occupancy.py)
    held_outside_max_ms: float | None = None  # the longest such wait of one request
    held_outside_longest_s: float | None = None  # the longest stretch with a request held outside
    scrapes: int = 0  # probe scrapes taken while the level had a request in flight
    unheld_longest_s: float | None = None  # scrapes in a row at which the server held fewer than in flight
    outside_wait_mean_ms: float | None = None  # records: the mean outside wait over the completed requests
    batch_queued: int = 0  # queued requests that waited mostly behind another request's prompt
    batch_wait_max_ms: float | None = None  # the longest such wait
    open_loop: OpenLoopLevel | None = None  # open loop: offered vs served and the backlog (open_loop.py)

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level, "requests": self.requests, "queued": self.queued,
            "queued_share": self.queued_share,
            "queue_wait_raw_ms": self.queue_wait_raw_ms.to_dict() if self.queue_wait_raw_ms else None,
            "queue_wait_ms": self.queue_wait_ms.to_dict() if self.queue_wait_ms else None,
            "queued_wait_ms": self.queued_wait_ms.to_dict() if self.queued_wait_ms else None,
            "peak_deferred": self.peak_deferred, "peak_busy_slots": self.peak_busy_slots,
            "batching_gain": self.batching_gain, "failure_share": self.failure_share,
            "queue_cause": self.queue_cause, "evidence": self.evidence, "slot_queued": self.slot_queued,
            "slot_wait_ms": self.slot_wait_ms.to_dict() if self.slot_wait_ms else None,
            "held_outside": self.held_outside, "held_outside_max_ms": self.held_outside_max_ms,
            "held_outside_longest_s": self.held_outside_longest_s, "scrapes": self.scrapes,
            "unheld_longest_s": self.unheld_longest_s, "batch_queued": self.batch_queued,
            "batch_wait_max_ms": self.batch_wait_max_ms,
            **({"open_loop": self.open_loop.to_dict()} if self.open_loop is not None else {}),
        }


@dataclass(frozen=True, slots=True)
class TargetVerdict:
    label: str
    total_slots: int | None
    overhead_ms: float | None
    knee: Knee | None
    levels: tuple[LevelQueueing, ...]
    metrics_available: bool
    lines: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label, "total_slots": self.total_slots, "overhead_ms": self.overhead_ms,
            "saturated_at": self.knee.at if self.knee else None,
            "knee": None if self.knee is None else self.knee.to_dict(),
            "metrics_available": self.metrics_available,
            "levels": [lv.to_dict() for lv in self.levels],
            "verdict": list(self.lines),
        }


def overhead_ms(records_at_1: Sequence[RequestRecord]) -> float | None:
    """Median raw queue wait at concurrency 1: tokenization + HTTP, no slot wait."""
    waits = [q for r in records_at_1 if (q := queue_wait_ms(r)) is not None]
    return statistics.median(waits) if waits else None


def corrected_queue_wait_ms(r: RequestRecord, overhead: float | None) -> float | None:
    raw = queue_wait_ms(r)
    if raw is None:
        return None
    return max(0.0, raw - (overhead or 0.0))


def is_queued(r: RequestRecord, overhead: float | None) -> bool:
    """Corrected queue wait > max(20 ms, 10% of the request's service time)."""
    wait = corrected_queue_wait_ms(r, overhead)
    service = service_ms(r)
    if wait is None or service is None:
        return False
    return wait > max(QUEUED_MIN_MS, QUEUED_SERVICE_SHARE * service)


def find_knee(points: Sequence[LevelPoint], knee_gain: float = 0.10, knee_latency: float = 0.50,
              slots_full: Collection[int | float] = (), total_slots: int | None = None,
              slots_free: Collection[int | float] = ()) -> Knee | None:
    """The saturation point: the first saturating step up the ladder (see the module's definition).

    `slots_full`: levels at which the server itself showed every slot busy and requests deferred:
    going into one with latency up is saturation whatever throughput did (on a real server it can
    still creep up while HTTP and tokenization overlap the busy slot). `slots_free`: levels whose
    records show no request waiting for a slot. `total_slots` lets a bracket that ends on the slot
    count be called exact.
    """
    ordered = [p for p in sorted(points, key=lambda p: p.level)
               if p.throughput_tok_s > 0 and p.latency_mean_ms]
    best: LevelPoint | None = None
    low: int | float | None  # the bracket's low end: None when the ladder's first level already saturated
    for i, (here, nxt) in enumerate(zip(ordered, ordered[1:])):
        best = here if best is None or here.throughput_tok_s > best.throughput_tok_s else best
        step = nxt.level / here.level - 1
        gain = nxt.throughput_tok_s / best.throughput_tok_s - 1
        ratio = nxt.latency_mean_ms / here.latency_mean_ms  # type: ignore[operator]  # `ordered` keeps points with a latency
        flat = gain < knee_gain * step
        if ratio <= 1 + knee_latency * min(step, 1.0) or not (flat or nxt.level in slots_full):
            continue
        plateau = max(best.throughput_tok_s, nxt.throughput_tok_s) * (1 + knee_gain)
        if nxt.level not in slots_full and any(p.throughput_tok_s > plateau for p in ordered[i + 2:]):
            continue  # a later level rose well past it: a dip (a noisy machine), not a knee
        below = ordered[i - 1].level if i else None
        if nxt.level in slots_full and here.level in slots_free:  # the slots ran out between P and N
            low, high, at_low = here.level, nxt.level, True
        elif flat and gain < knee_gain:  # N added nothing: saturated by P already
            low, high, at_low = below, here.level, False
        elif flat:  # N still gained: the knee is above P
            low, high, at_low = here.level, nxt.level, False
        else:  # the slots ran out before N
            low, high, at_low = here.level, nxt.level, True
        knee_at, between = _place(low, high, at_low, total_slots)
        at_or_below = low is None and not (isinstance(high, int) and high == 1)
        return Knee(knee_at, nxt.level, gain, ratio, between, at_or_below)
    return None


def _place(low: int | float | None, high: int | float, at_low: bool,
           total_slots: int | None) -> tuple[int | float, tuple[int | float, int | float] | None]:
    """Where in the bracket the knee is: exact when the ladder leaves no level between (neighbouring
    concurrencies) or the bracket's end is the slot count; else (the lowest level known saturated,
    the bracket)."""
    if low is None:
        return high, None
    exact_end = low if at_low else high
    neighbours = isinstance(low, int) and isinstance(high, int) and high - low == 1
    if neighbours or exact_end == total_slots:
        return exact_end, None
    return high, (low, high)


def slots_exhausted(q: LevelQueueing, total_slots: int | None) -> bool:
    """The evidence of a full house: most of the level's requests waited for a slot while every slot
    was busy (the records' own timings), or, judged from scrapes, every slot busy, requests deferred
    and most of the level's requests queued."""
    if total_slots is None or not q.requests:
        return False
    if q.evidence == "records":
        return q.slot_queued / q.requests >= 0.5
    return q.peak_busy_slots == total_slots and bool(q.peak_deferred) and q.queued_share >= 0.5


def _peak(values: Sequence[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def level_queueing(level: int | float, rs: Sequence[RequestRecord], samples: Sequence[ProbeSample],
                   overhead: float | None, throughput: float, throughput_at_1: float | None,
                   total_slots: int | None = None, all_records: bool = True,
                   scrapes_readable: bool = True) -> LevelQueueing:
    """A level's queuing figures and why its queued requests waited (see occupancy.py): from the
    records' own timings when the slot count is known and `all_records` (the level's every record is
    here), else from the scrapes."""
    ok = [r for r in rs if r.ok]
    queued_flags = [is_queued(r, overhead) for r in ok]
    queued = sum(queued_flags)
    counted = [r for r in rs if r.error_kind not in CLIENT_SIDE]
    occupancy = level_occupancy(ok, total_slots, overhead) if all_records else None
    scraped = scrape_evidence(rs, samples)
    peak_busy = _peak([scraped.peak_busy_slots, occupancy.peak_busy_slots if occupancy else None])
    slot_waits: list[float] = []
    batch_waits: list[float] = []
    if occupancy is not None:
        for _record, flag, split in zip(ok, queued_flags, occupancy.splits):
            if not flag or split is None:
                continue
            if split.slot_wait_ms >= max(split.outside_wait_ms, split.batch_wait_ms):
                slot_waits.append(split.slot_wait_ms)
            elif split.batch_wait_ms >= split.outside_wait_ms:
                batch_waits.append(split.batch_wait_ms)
        cause = _records_cause(queued, len(slot_waits), len(batch_waits), occupancy)
    else:
        cause = _scrapes_cause(queued, scraped, total_slots, scrapes_readable)
        if cause == SLOTS:
            slot_waits = [w for r, flag in zip(ok, queued_flags)
                          if flag and (w := corrected_queue_wait_ms(r, overhead)) is not None]
    return LevelQueueing(
        level=level,
        requests=len(ok),
        queued=queued,
        queued_share=queued / len(ok) if ok else 0.0,
        queue_wait_raw_ms=distribution_ms([q for r in ok if (q := queue_wait_ms(r)) is not None]),
        queue_wait_ms=distribution_ms([q for r in ok if (q := corrected_queue_wait_ms(r, overhead)) is not None]),
        queued_wait_ms=distribution_ms([q for r in ok if is_queued(r, overhead)
                                        and (q := corrected_queue_wait_ms(r, overhead)) is not None]),
        peak_deferred=_peak([s.requests_deferred for s in samples]),
        peak_busy_slots=peak_busy,
        batching_gain=throughput / throughput_at_1 if throughput_at_1 else None,
        failure_share=(len(counted) - len(ok)) / len(counted) if counted else 0.0,
        queue_cause=cause,
        evidence="records" if occupancy is not None else "scrapes",
        slot_queued=len(slot_waits),
        slot_wait_ms=distribution_ms(slot_waits),
        held_outside=occupancy.held_outside if occupancy else 0,
        held_outside_max_ms=occupancy.held_outside_max_ms if occupancy else None,
        held_outside_longest_s=occupancy.held_outside_longest_s if occupancy else None,
        scrapes=scraped.scrapes,
        unheld_longest_s=scraped.unheld_longest_s if scraped.scrapes else None,
        outside_wait_mean_ms=_mean_outside(occupancy),
        batch_queued=len(batch_waits),
        batch_wait_max_ms=max(batch_waits, default=None),
    )


def _mean_outside(occupancy: LevelOccupancy | None) -> float | None:
    waits = [split.outside_wait_ms for split in occupancy.splits if split is not None] if occupancy else []
    return statistics.fmean(waits) if waits else None


def _records_cause(queued: int, slot_queued: int, batch_queued: int, occupancy: LevelOccupancy) -> str | None:
    """Why queued requests waited, by the records: whichever of a slot, a prompt in progress and
    the outside held most of them (a slot on a tie)."""
    if not queued and not occupancy.held_outside:
        return None
    counts = {SLOTS: slot_queued, BATCH: batch_queued, OUTSIDE: occupancy.held_outside}
    return max(counts, key=lambda cause: counts[cause])


def _scrapes_cause(queued: int, scraped: ScrapeEvidence, total_slots: int | None, readable: bool) -> str | None:
    """Why queued requests waited, by the scrapes alone: the server showed a slot queue (every slot
    busy, or a deferred request); or enough scrapes showed none; else too short to tell."""
    if not queued:
        return None
    if not readable:
        return UNKNOWN
    if scraped.peak_deferred or (total_slots is not None and scraped.peak_busy_slots == total_slots):
        return SLOTS
    if scraped.scrapes >= MIN_SCRAPES and scraped.peak_deferred == 0:
        return OUTSIDE
    return TOO_SHORT


def _pct(x: float) -> str:
    return f"{x * 100:+.0f}%"


def _secs(ms: float) -> str:
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def _slots(n: int | None) -> str:
    return "?" if n is None else f"{n} slot" + ("" if n == 1 else "s")


def analyze_target(label: str, summaries: Sequence[LevelSummary | LevelFigures | Mapping[str, Any]],
                   records: Sequence[RequestRecord],
                   samples: Sequence[ProbeSample], total_slots: int | None, metrics_available: bool,
                   knee_gain: float = 0.10, knee_latency: float = 0.50, open_loop: bool = False,
                   slots_available: bool | None = None, trace: bool = False) -> TargetVerdict:
    """Verdicts for one target from its level summaries (run.json), records and probe samples.

    Open loop (levels are offered request rates): each level is judged on its own, from what was
    offered and what was served (open_loop.py), and the knee is the lowest level that did not keep
    up (`open_loop_knee`); slot and HTTP-overhead reasoning, which needs concurrency 1, is skipped.
    `trace`: the one level is a trace's replay, and is said so.
    """
    levels = [LevelFigures.of(lv) for lv in summaries]
    if not completed_any(levels):  # no evidence, no verdict: say why there is none
        return TargetVerdict(label, total_slots, None, None, (), metrics_available, (no_verdict_line(label, levels),))
    by_level: dict[int | float, list[RequestRecord]] = {}
    for r in records:
        by_level.setdefault(r.level, []).append(r)
    samples_by_level: dict[int | float, list[ProbeSample]] = {}
    for s in samples:
        samples_by_level.setdefault(s.level, []).append(s)
    concurrencies = [lv.key for lv in levels]
    throughput = {lv.key: lv.throughput_tok_s for lv in levels}
    overhead = overhead_ms(by_level.get(1, [])) if 1 in concurrencies and not open_loop else None
    # --models: a router answers /metrics per model only (?model=), never "off" (run/router.py)
    router = not metrics_available and any(r.model is not None for r in records)
    at_1 = None if open_loop else throughput.get(1)
    readable = metrics_available or bool(slots_available) or any(
        s.busy_slots is not None or s.requests_processing is not None for s in samples)
    queueing = tuple(level_queueing(c, by_level.get(c, []), samples_by_level.get(c, []), overhead,
                                    throughput[c], at_1, total_slots, _all_records(lv, by_level.get(c, [])),
                                    readable)
                     for c, lv in zip(concurrencies, levels))
    by_c = {q.level: q for q in queueing}
    # A level cut short (Ctrl-C, a dead server) would fake a knee: only full levels are compared,
    # and only those with a completed request (one where every request failed measured nothing).
    # Their latency is net of any wait outside the server (held by its HTTP layer, occupancy.py):
    # that is not the server's slots running out, and must not place a knee.
    points = [LevelPoint(lv.key, lv.throughput_tok_s, _net_latency(lv, by_c[lv.key]))
              for lv in levels if not lv.stopped_reason and has_completed(lv)]
    slots_full = {q.level for q in queueing if slots_exhausted(q, total_slots)}
    slots_free = {q.level for q in queueing if q.evidence == "records" and not q.slot_queued}
    if open_loop:
        queueing = tuple(replace(q, open_loop=judge_level(
            q.level, lv.rate, by_level.get(q.level, []), requests_ok=lv.requests_ok,
            peak_in_flight=lv.concurrency_reached,
            queue_wait_max_ms=q.queue_wait_ms.max if q.queue_wait_ms else None))
            for q, lv in zip(queueing, levels))
        knee = open_loop_knee(points, [q.open_loop for q in queueing if q.open_loop is not None],
                              {lv.key for lv in levels if lv.stopped_reason or not has_completed(lv)})
        lines = _open_loop_lines(label, knee, queueing, levels, metrics_available or router, trace)
        lines += _failure_lines(label, queueing, open_loop) + ([router_metrics_line(label)] if router else [])
        return TargetVerdict(label, total_slots, overhead, knee, queueing, metrics_available, tuple(lines))
    knee = find_knee(points, knee_gain, knee_latency, slots_full, total_slots, slots_free)
    lines = _verdict_lines(label, total_slots, overhead, knee, queueing, metrics_available or router,
                           max(concurrencies, default=0), [p.level for p in points], slots_full)
    lines += _failure_lines(label, queueing, open_loop) + ([router_metrics_line(label)] if router else [])
    return TargetVerdict(label, total_slots, overhead, knee, queueing, metrics_available, tuple(lines))


def router_metrics_line(label: str) -> str:
    """A --models run's line in place of "/metrics unavailable": the router has /metrics, per model."""
    return (f"{label}: a router answers /metrics per model only (/metrics?model=NAME, which would load an unloaded "
            "model), so loadgen does not read it: the deferred queue is not visible; see the router table "
            "for model loads.")


def _all_records(lv: LevelFigures, rs: Sequence[RequestRecord]) -> bool:
    """Whether `rs` holds every completed record of the level (a streamed level keeps a sample)."""
    ok = lv.requests_ok
    return ok is None or sum(1 for r in rs if r.ok) >= ok


def _net_latency(lv: LevelFigures, q: LevelQueueing) -> float | None:
    """The level's mean latency, less its requests' mean wait outside the server when any were held there."""
    mean = lv.latency_ms.mean if lv.latency_ms else None
    if mean is None or not q.held_outside or q.outside_wait_mean_ms is None:
        return mean
    return mean - q.outside_wait_mean_ms


def _verdict_lines(label: str, total_slots: int | None, overhead: float | None, knee: Knee | None,
                   queueing: Sequence[LevelQueueing], metrics_available: bool, top: int | float,
                   full_levels: Sequence[int | float] = (), slots_full: Collection[int | float] = ()) -> list[str]:
    lines: list[str] = []
    by_c = {q.level: q for q in queueing}
    if knee is not None:
        after = by_c[knee.next_level]
        queue = []
        if after.peak_deferred:
            n = after.peak_deferred
            queue.append(f"up to {n:g} request{'' if n == 1 else 's'} deferred")
        wait = _slot_wait(after)
        if after.queue_cause == SLOTS and wait is not None:
            queue.append(f"median queue wait {_secs(wait.p50)}")
        head, why = _knee_head(label, knee, total_slots, after.peak_busy_slots)
        lines.append(f"{head}.")
        if why:
            lines.append(f"{label}: {why}.")
        lines.append(f"{label} from c={knee.next_level}: throughput {_pct(knee.throughput_gain)}, "
                     f"latency ×{knee.latency_ratio:.1f}.")
        if queue:
            lines.append(f"{label} at c={knee.next_level}: " + ", ".join(queue) + ".")
    elif len(full_levels) == 1:
        lines += _one_level_lines(label, by_c[full_levels[0]], total_slots, full_levels[0] in slots_full)
    else:
        full = sorted(c for c in slots_full if c in full_levels)
        if full:
            lines.append(f"{label} runs out of slots at c={full[0]}, though throughput and latency show no knee.")
            lines.append(_slot_evidence(label, by_c[full[0]], total_slots))
        else:
            slots = "its slot count is unknown" if total_slots is None else f"it has {_slots(total_slots)}"
            lines.append(f"{label} is not saturated up to concurrency {top}; {slots}.")
            slot_waits = [q for q in queueing if q.queue_cause == SLOTS and q.slot_queued]
            worst = max(slot_waits, key=lambda q: q.slot_queued / max(q.requests, 1), default=None)
            wait = _slot_wait(worst) if worst is not None else None
            if worst is not None and wait is not None:
                lines.append(f"{label}: still, {worst.slot_queued} of {worst.requests} requests at c={worst.level} "
                             f"waited for a slot (median {_secs(wait.p50)}).")
    by_value = sorted(queueing, key=lambda q: q.level)  # a capacity search runs its levels out of order
    for q in by_value:
        lines += _cause_lines(label, q)
    gains = [f"c={q.level} {q.batching_gain:.2f}×" for q in by_value if q.batching_gain and q.level != 1]
    if gains:
        lines.append(f"{label} batching gain vs c=1: " + ", ".join(gains) + ".")
    if overhead is None:
        lines.append(f"{label}: no concurrency-1 level, so queue waits are not corrected for HTTP overhead.")
    if not metrics_available:
        lines.append(f"{label}: /metrics unavailable (start llama-server with --metrics); "
                     "queuing is judged from /slots and per-request timings only.")
    return lines


def _slot_wait(q: LevelQueueing) -> Distribution | None:
    """The waits of a level's requests queued for a slot: net of waits outside the server."""
    return q.slot_wait_ms if q.slot_wait_ms is not None else q.queued_wait_ms


def _slot_evidence(label: str, q: LevelQueueing, total_slots: int | None) -> str:
    """The line that shows a level ran out of slots."""
    busy = "its slot was" if total_slots == 1 else f"all {_slots(total_slots)} were"
    if q.evidence == "records":
        return f"{label} at c={q.level}: {q.slot_queued} of {q.requests} requests waited while {busy} busy."
    n = q.peak_deferred or 0
    return f"{label} at c={q.level}: {busy} busy, {n:g} deferred, {q.queued} of {q.requests} requests waited."


def _one_level_lines(label: str, q: LevelQueueing, total_slots: int | None, full: bool) -> list[str]:
    """One level cannot place a knee (there is no step to compare): say what its slot evidence shows."""
    lines = [f"{label}: one level (c={q.level}) cannot place a knee."]
    if full:
        lines.append(_slot_evidence(label, q, total_slots))
        lines.append(f"{label}: saturated at c={q.level} or below; add lower levels to find where.")
    elif q.queue_cause in (TOO_SHORT, UNKNOWN):
        pass  # its cause line says why nothing can be told
    elif q.slot_queued:
        lines.append(f"{label} at c={q.level}: {q.slot_queued} of {q.requests} requests waited for a slot; "
                     "add levels around it.")
    else:
        lines.append(f"{label}: no request waited for a slot; add higher levels to find the knee.")
    return lines


def _cause_lines(label: str, q: LevelQueueing) -> list[str]:
    """What a level's waits outside the slot queue were, or that it was too short to tell."""
    lines: list[str] = []
    waited = (f"{label} at c={q.level}: {q.queued} of {q.requests} requests waited to start (median "
              f"{_secs(q.queued_wait_ms.p50)})" if q.queued_wait_ms is not None else None)
    if q.queue_cause == TOO_SHORT and waited:
        lines.append(f"{waited}.")
        lines.append(f"{label} at c={q.level}: too short to tell if for a slot; give --duration or more --requests.")
    elif q.queue_cause == UNKNOWN and waited:
        lines.append(f"{waited}; whether for a slot is unknown (no /metrics, /slots).")
    elif q.queue_cause == OUTSIDE and q.evidence == "scrapes" and waited:
        lines.append(f"{waited}, not for a slot.")
    if q.batch_queued and (q.batch_wait_max_ms or 0.0) >= HTTP_HOLD_MS:
        lines.append(f"{label} at c={q.level}: {q.batch_queued} of {q.requests} requests waited up to "
                     f"{_secs(q.batch_wait_max_ms or 0.0)} behind another's prompt.")
    held_ms = q.held_outside_max_ms or 0.0
    if q.held_outside and q.evidence == "records" and held_ms >= HTTP_HOLD_MS:
        # Shorter outside waits (tokenization, a busy client or server loop) are in the queuing
        # table; a line is for a wait a user would notice.
        lines.append(f"{label} at c={q.level}: {q.held_outside} of {q.requests} requests waited up to "
                     f"{_secs(held_ms)} outside the server.")
        if q.unheld_longest_s is not None and q.unheld_longest_s * 1000 >= HTTP_HOLD_MS:
            lines.append(f"{label} at c={q.level}: for {q.unheld_longest_s:.1f} s its /metrics held fewer "
                         "requests than were in flight.")
        lines.append(f"{label}: its HTTP threads ran out: raise --threads-http or open fewer connections.")
    return lines


def _knee_head(label: str, knee: Knee, total_slots: int | None, busy_after: int | None) -> tuple[str, str | None]:
    """Where the knee is and what the slot count says of it, and why when that takes a sentence of its
    own. "Below its slots" only on evidence: the whole bracket is below the slot count, and the level
    after it still had a slot free."""
    head = _knee_where(label, knee, total_slots)
    high = knee.between[1] if knee.between else knee.at
    if total_slots is not None and high < total_slots and (busy_after is None or busy_after < total_slots):
        free = ("slots were free" if busy_after is None
                else f"at c={knee.next_level} at most {busy_after} slot{' was' if busy_after == 1 else 's were'} busy")
        return head, f"{free}, so compute, not slots, is the bottleneck"
    return head, None


def _knee_where(label: str, knee: Knee, total_slots: int | None) -> str:
    low, high = knee.between or (knee.at, knee.at)
    if knee.at_or_below:
        head = f"{label} is saturated from the lowest tested level, concurrency {knee.at} (the knee is there or below)"
        if total_slots is not None and total_slots < knee.at:
            return head + f"; its {_slots(total_slots)} are below it"
    elif knee.between is None:
        head = f"{label} saturates at concurrency {knee.at}"
    else:
        head = f"{label} saturates between concurrency {low} and {high}"
    if total_slots is None:
        return head
    if knee.between is None and knee.at == total_slots:
        return head + f" = its {_slots(total_slots)}"
    if low <= total_slots <= high:
        return head + f"; its {_slots(total_slots)} are in that range"
    if high < total_slots:
        return head + f", below its {_slots(total_slots)}"
    return head + f", above its {_slots(total_slots)}"


def _failure_lines(label: str, queueing: Sequence[LevelQueueing], open_loop: bool) -> list[str]:
    return [f"{label} at {level_short(q.level, open_loop)}: {q.failure_share:.0%} of requests failed, "
            "so that level's figures are not trustworthy."
            for q in queueing if q.failure_share > UNTRUSTED_FAILURE_SHARE]


# The client is behind its schedule when its sends are this late at the 99th percentile.
SCHEDULE_LAG_P99_MS = 5.0


def _rate(rate: float) -> str:
    """"4 req/s"; a level of `--rate inf` is "every request at once", not "inf req/s"."""
    return "every request at once" if math.isinf(rate) else f"{rate:g} req/s"


def _at_rate(rate: float) -> str:
    return "with every request at once" if math.isinf(rate) else f"at {rate:g} req/s"


def open_loop_knee(points: Sequence[LevelPoint], judged: Sequence[OpenLoopLevel],
                   unjudged: Collection[int | float] = ()) -> Knee | None:
    """Open loop: the lowest fully run level that does not keep up (overloaded or at its limit,
    open_loop.py) is saturated; the highest level below it that kept up bounds the knee from below
    (`between`), else it is at or below the lowest offered rate. The knee and the levels' verdicts
    so never contradict each other. Throughput gain and latency ratio are those of that step."""
    full = sorted((j for j in judged if j.level not in unjudged), key=lambda j: j.level)
    bad = next((j for j in full if j.verdict in (OVERLOADED, AT_LIMIT)), None)
    if bad is None:
        return None
    kept = [j.level for j in full if j.level < bad.level and j.verdict == KEEPS_UP]
    low = kept[-1] if kept else None
    by_level = {p.level: p for p in points}
    here, there = by_level.get(low) if low is not None else None, by_level.get(bad.level)
    below = [p.throughput_tok_s for p in points if p.level < bad.level]
    gain = there.throughput_tok_s / max(below) - 1 if there is not None and below and max(below) > 0 else 0.0
    ratio = (there.latency_mean_ms / here.latency_mean_ms
             if here is not None and there is not None and here.latency_mean_ms and there.latency_mean_ms else 1.0)
    if low is None:
        return Knee(bad.level, bad.level, gain, ratio, None, at_or_below=not isinstance(bad.level, int) or bad.level != 1)
    return Knee(bad.level, bad.level, gain, ratio, (low, bad.level))


def _served(j: OpenLoopLevel) -> str:
    """"served 0.133 of 1.56 req/s offered"."""
    return f"served {j.served_rate:.3g} of {j.offered_rate:.3g} req/s offered"


def _backlog(j: OpenLoopLevel, deferred: float | None = None) -> list[str]:
    facts = []
    if j.latency_first_ms is not None and j.latency_last_ms is not None and j.backlog_grew:
        facts.append(f"latency rose from {_secs(j.latency_first_ms)} to {_secs(j.latency_last_ms)} through the level")
    if j.peak_in_flight:
        facts.append(f"up to {j.peak_in_flight} request{'' if j.peak_in_flight == 1 else 's'} in flight")
    if j.queue_wait_max_ms is not None and j.queue_wait_max_ms >= QUEUED_MIN_MS:
        facts.append(f"requests queued up to {_secs(j.queue_wait_max_ms)}")
    if deferred:
        facts.append(f"up to {deferred:g} deferred by the server")
    return facts


def _judged_line(label: str, j: OpenLoopLevel, trace: bool, deferred: float | None = None) -> str | None:
    """One level's open-loop verdict in words; None for a level that kept up (said together).
    `deferred`: the most requests the server's /metrics showed deferred during the level."""
    where = "replaying the trace" if trace else _at_rate(j.level)
    if j.verdict == OVERLOADED:
        return f"{label} is overloaded {where}: " + "; ".join([_served(j), *_backlog(j, deferred)]) + "."
    if j.verdict == AT_LIMIT:
        why = ("but its backlog grew" if j.backlog_grew
               else f"under the {KEEPS_UP_SHARE:.0%} of the offer that keeping up takes")
        return f"{label} is at its limit {where}: " + "; ".join([f"{_served(j)}, {why}", *_backlog(j, deferred)]) + "."
    if j.verdict == KEEPS_UP:
        return None
    if j.offered_rate is None:  # every request at once: no rate to keep up with, only what it served
        return (f"{label} {where}: served {j.served_rate:.3g} req/s." if j.served_rate is not None
                else None)
    return f"{label} {where}: too few answers ({j.requests_ok}) to tell whether it keeps up."


def _open_loop_lines(label: str, knee: Knee | None, queueing: Sequence[LevelQueueing],
                     levels: Sequence[LevelFigures], metrics_available: bool, trace: bool = False) -> list[str]:
    lines: list[str] = []
    judged = [q.open_loop for q in queueing if q.open_loop is not None]
    deferred = {q.level: q.peak_deferred for q in queueing}
    stopped = {lv.key for lv in levels if lv.stopped_reason}
    kept = [j for j in judged if j.verdict == KEEPS_UP and j.level not in stopped]
    if kept and trace:
        lines.append(f"{label} keeps up with the trace: {_served(kept[0])}, no backlog.")
    elif kept and len(kept) == len([j for j in judged if j.level not in stopped]):
        top = max(j.level for j in kept)
        lines.append(f"{label} keeps up with every offered rate (up to {_rate(top)}): it served what was "
                     "offered and no backlog grew.")
    elif kept:
        rates = ", ".join(f"{j.level:g}" for j in kept)
        lines.append(f"{label} keeps up at {rates} req/s: it served what was offered and no backlog grew.")
    for j in judged:  # the levels it did not keep up with, lowest first
        line = _judged_line(label, j, trace, deferred.get(j.level)) if j.level not in stopped else None
        if line:
            lines.append(line)
    if knee is not None and not trace and len(judged) > 1:  # one level: its own line said it all
        where = (f"between {_rate(knee.between[0])} and {_rate(knee.between[1])}" if knee.between
                 else f"at or below {_rate(knee.at)}, the lowest offered rate" if knee.at_or_below
                 else _at_rate(knee.at))
        lines.append(f"{label} saturates {where}: requests arrive faster than it answers them.")
    for lv in levels:
        lag = lv.schedule_lag_ms.p99 if lv.schedule_lag_ms else None
        if lag is not None and lag > SCHEDULE_LAG_P99_MS:
            lines.append(f"{label} {_at_rate(lv.key)}: the client sent requests late (schedule lag p99 "
                         f"{lag:.1f} ms): the client, not the server, may be the bottleneck; "
                         "latencies still count from the intended send times.")
        corrected = lv.latency_ms.p99 if lv.latency_ms else None
        raw = lv.latency_uncorrected_ms.p99 if lv.latency_uncorrected_ms else None
        if corrected and raw and corrected > 1.2 * raw:
            lines.append(f"{label} {_at_rate(lv.key)}: p99 latency {_secs(corrected)} from the intended "
                         f"send times vs {_secs(raw)} from the actual sends: requests waited to be sent "
                         "(coordinated omission would have hidden this).")
    if not metrics_available:
        lines.append(f"{label}: /metrics unavailable, so the server's deferred queue is not visible.")
    return lines


class _ServerFacts(msgspec.Struct, frozen=True):
    total_slots: int | None = None
    metrics_enabled: bool | None = None
    slots_enabled: bool | None = None


class _TargetFacts(msgspec.Struct, frozen=True):
    """What the verdict reads of a run document's target (its dict, or `core.rundoc.Target`)."""

    label: str
    levels: list[LevelFigures]
    server: _ServerFacts | None = None


def target_verdict(target: Any, records: list[RequestRecord], samples: list[ProbeSample],
                   knee_gain: float, knee_latency: float, open_loop: bool = False,
                   trace: bool = False) -> dict[str, Any]:
    """The saturation verdict of one target of a run document (pure)."""
    facts = msgspec.convert(target, _TargetFacts, from_attributes=True, strict=False)
    server = facts.server or _ServerFacts()
    return analyze_target(facts.label, facts.levels, records, samples, server.total_slots,
                          bool(server.metrics_enabled), knee_gain, knee_latency, open_loop,
                          bool(server.slots_enabled), trace).to_dict()
