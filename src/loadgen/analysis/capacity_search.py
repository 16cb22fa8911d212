"""The capacity search's decisions: which level to probe next, when to stop, and what the answer is.

Pure functions over the probes made so far (each a level run once, judged against an SLO by
analysis/slo.py); the driver (run/capacity.py) runs what `next_probe` asks for and nothing else.

A probe's *score* is slo.SloLevel.score: the worst target ratio (value / target) at the attainment
quantile; it passes exactly when score <= 1. Its margin is |score - 1|.

Deciding a level from its probes (`decide_level`), with `repeat` R and relative `noise` N:
- REPEAT (probe it again) while it has fewer than R probes and either they disagree (some pass,
  some fail) or one lies within the noise of the target (|score - 1| <= N): a margin that small
  is what run-to-run noise alone can move across the line;
- by rate, also REPEAT a level whose probes all passed, one of them with a score of 0.5 or more
  (RATE_CONFIRM_BELOW), until it has R: a rate passes on R arrival schedules, not one; and a rate
  passed on several schedules passes only when a fresh run at it would too (`holds_fresh`): the
  95% lower prediction bound of a new run's attainment (of `hold_s` seconds), from the schedules'
  attainments (binomial where they agree within binomial noise, the probes' own spread where they
  spread wider; `holds_fresh`), is at least the asked attainment; else the rate sits on the line
  (INCONCLUSIVE). One open-loop level's attainment swings by about ±10% from one arrival schedule
  to the next near the line, so the highest rate that passed three schedules was often one a
  fresh run missed (the winner's curse of a search);
- else PASS when every probe passed, FAIL when none did, INCONCLUSIVE when they disagree (after R
  probes: the level sits on the line at this noise, and is said to, never decided by a coin flip).
With R = 1 a single probe decides.

Choosing the next level (`next_probe`), levels as integers from 1 (concurrency), or rates:
1. a level the rule above wants repeated, lowest first;
2. no level failed or was inconclusive yet: double the highest passing level (from `start`),
   up to `max_level`; stop when `max_level` passed (the answer is at least that);
3. else the bracket: hi = the lowest level that did not pass, lo = the highest passing level
   below it; while they are more than one step apart, probe the middle ((lo + hi) // 2; for
   rates the midpoint, until hi / lo <= 1 + `rate_resolution`); when nothing passed below hi: by
   rate, halve hi (three significant digits) until a rate passes or the next would be below
   `min_rate`; by concurrency, probe `start` when hi is above it, else halve hi (a `start` above 1
   that failed: tune's searches start at a screen's answer) until a level passes, stopping at 1;
   with `at_least` (capacity `--at-least`: tune's screen against its bar) a `start` that does not
   pass ends the search there, by concurrency and by rate: the question was only whether the
   capacity reaches `start`, and the answer is that it does not (nothing below it is searched).
The first level is `start`, or `max_level` when that is lower: no level is ever above the cap.

The answer (`conclude`): feasible_max = lo (None when nothing passed), infeasible_min = the lowest
FAIL level (None if none failed), inconclusive = the levels decided INCONCLUSIVE. When hi itself is
inconclusive the capacity lies between lo and hi at this noise.
- binding target: at hi, the target with the highest ratio at the quantile (the one that broke
  first); without hi, at lo (the one closest to its target). Failed requests are "error".
- shape: *cliff* when the score more than doubles from lo to hi (e.g. TTFT jumps from prefill to
  prefill + a whole answer once a request waits for a slot), or hi had an infinite score (errors
  beyond the attainment); *smooth* when it creeps over the line; None without both lo and hi.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec

PASS, FAIL, INCONCLUSIVE, REPEAT = "pass", "fail", "inconclusive", "repeat"
CLIFF, SMOOTH = "cliff", "smooth"
CLIFF_FACTOR = 2.0
DEFAULT_NOISE = 0.10
DEFAULT_REPEAT = 3
RATE_RESOLUTION = 0.10
# By rate, a pass whose score is at least this (its p-quantile above half its target) is confirmed
# on `repeat` arrival schedules before the rate passes: an open-loop level's attainment swings by
# ±10% between schedules near the line (five 120 s runs at one answered rate: 70-96%), so a single
# lucky schedule used to be the answer and a fresh run at it met the target 1 time in 5.
RATE_CONFIRM_BELOW = 0.5
# A rate's answer holds on a fresh run with this probability (holds_fresh): 19 runs in 20, so that 4
# of 5 fresh runs hold 98% of the time. At 0.9 the answers of benchmarks/rate_capacity_holds.py held
# 16 of 20 fresh runs, and one answer in four held only 3 of 5 (docs/benchmarks.md).
FRESH_RUN_CONFIDENCE = 0.95
# The fresh run a rate's answer must hold on (holds_fresh): two minutes, the length a user checks an
# answer with. At a rate whose level (40 requests at least) holds more requests than two minutes do,
# below 1/3 req/s, the shorter run's attainment swings more and the margin widens to match.
DEFAULT_HOLD_S = 120.0
MIN_RATE = 0.01  # req/s: a rate search halving downwards stops below this (one request every 100 s)


@dataclass(frozen=True, slots=True)
class CapacitySettings:
    """How the search runs (kinds/capacity/command.py builds it once)."""

    by_rate: bool = False
    max_level: int | float = 64
    start: int | float = 1
    repeat: int = DEFAULT_REPEAT
    noise: float = DEFAULT_NOISE
    budget_requests: int | None = None
    budget_s: float | None = None
    hold_s: float | None = DEFAULT_HOLD_S  # by rate: the fresh run an answer must hold on (holds_fresh)
    at_least: bool = False  # a start that does not pass ends the search (next_probe)

    def to_dict(self) -> dict[str, object]:
        return {"by": "rate" if self.by_rate else "concurrency", "max_level": self.max_level, "start": self.start,
                "repeat": self.repeat, "noise": self.noise, "budget_requests": self.budget_requests,
                "budget_s": self.budget_s, "hold_s": self.hold_s, "at_least": self.at_least}


@dataclass(frozen=True, slots=True)
class Probe:
    """One run of a level, judged: did it pass, its score (None: infinite) and per-target ratios."""

    level: int | float
    passed: bool
    score: float | None
    ratio: Mapping[str, float | None] = field(default_factory=dict)
    attainment: float | None = None
    # Open loop: the level's own verdict (analysis/open_loop.py); a rate the server did not keep up
    # with never passes, whatever its latencies did in a short level.
    open_loop: str | None = None
    judged: int | None = None  # requests judged (SloLevel.judged)
    required: float | None = None  # the attainment asked (SloLevel.required)


def holds_fresh(probes: Sequence[Probe], confidence: float = FRESH_RUN_CONFIDENCE,
                hold_s: float | None = None) -> bool:
    """Whether a fresh run at this rate would meet the asked attainment with probability
    `confidence`: a one-sided lower prediction bound of a new run's attainment against the asked one.
    The new run lasts `hold_s` seconds at the probes' rate (None: as long as a probe); one holding
    fewer requests than a probe swings more, never less for a longer one. Two cases:
    - the schedules agree within binomial noise (their spread no wider than the binomial sd of one
      probe): the attainment is a share p of independent requests, estimated from all the probes'
      requests pooled, so the bound is mean - z(confidence) * sqrt(p(1-p)/m + p(1-p)/N), m the fresh
      run's requests, N the probes' (p with half a miss added, so a perfect record still has a spread);
    - they spread wider (the schedule itself moves the attainment): the normal prediction bound from
      the probes, mean - t(confidence, n-1) * sqrt(sd_new^2 + sd^2/n), sd their spread, sd_new it
      grown by sqrt(requests per probe / m).
    True when the probes lack the figures (older runs) or are fewer than two (nothing to predict from)."""
    values = [p.attainment for p in probes if p.attainment is not None]
    judged = [p.judged for p in probes if p.judged]
    required = next((p.required for p in probes if p.required is not None), None)
    if len(values) < 2 or len(values) < len(probes) or not judged or required is None:
        return True
    from scipy import stats  # the capacity search only: not on the import path of the other commands

    n = len(values)
    mean = sum(values) / n
    per_level = sum(judged) / len(judged)
    fresh = per_level if hold_s is None else min(per_level, max(probes[0].level * hold_s, 1.0))
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    pooled = per_level * n
    share = (mean * pooled + 0.5) / (pooled + 1)  # half a miss added: a perfect record is not a certainty
    binomial = share * (1 - share)
    if spread ** 2 <= binomial / per_level:
        bound = mean - float(stats.norm.ppf(confidence)) * math.sqrt(binomial / fresh + binomial / pooled)
    else:
        sd_new = spread * math.sqrt(per_level / fresh)
        bound = mean - float(stats.t.ppf(confidence, n - 1)) * math.sqrt(sd_new ** 2 + spread ** 2 / n)
    return bound >= required - 1e-12


def _score(p: Probe) -> float:
    return math.inf if p.score is None else p.score


def decide_level(probes: Sequence[Probe], repeat: int = DEFAULT_REPEAT, noise: float = DEFAULT_NOISE,
                 by_rate: bool = False, hold_s: float | None = None) -> str:
    """PASS, FAIL, INCONCLUSIVE or REPEAT for one level's probes (module docstring). `by_rate`: a
    passing rate whose score is not far below the line (RATE_CONFIRM_BELOW) is run `repeat` times
    before it passes, and only if a fresh run of `hold_s` seconds would hold (`holds_fresh`)."""
    if not probes:
        return REPEAT
    passes = {p.passed for p in probes}
    near = any(abs(_score(p) - 1.0) <= noise for p in probes)
    unconfirmed = by_rate and passes == {True} and any(_score(p) >= RATE_CONFIRM_BELOW for p in probes)
    if len(probes) < repeat and (len(passes) > 1 or near or unconfirmed):
        return REPEAT
    if passes == {True}:
        return PASS if not by_rate or holds_fresh(probes, hold_s=hold_s) else INCONCLUSIVE
    if passes == {False}:
        return FAIL
    return INCONCLUSIVE


@dataclass(frozen=True, slots=True)
class Next:
    """The next level to probe (None: the search is over) and why, in words."""

    level: int | float | None
    reason: str


def _bracket(decisions: Mapping[int | float, str]) -> tuple[int | float | None, int | float | None]:
    """(lo, hi): the lowest level that did not pass, and the highest passing one below it."""
    not_passed = sorted(lv for lv, d in decisions.items() if d in (FAIL, INCONCLUSIVE))
    hi = not_passed[0] if not_passed else None
    passed = [lv for lv, d in decisions.items() if d == PASS and (hi is None or lv < hi)]
    return (max(passed) if passed else None), hi


def decisions_of(history: Mapping[int | float, Sequence[Probe]], repeat: int, noise: float,
                 by_rate: bool = False, hold_s: float | None = None) -> dict[int | float, str]:
    return {lv: decide_level(ps, repeat, noise, by_rate, hold_s) for lv, ps in history.items()}


def next_probe(history: Mapping[int | float, Sequence[Probe]], *, max_level: int | float, repeat: int = DEFAULT_REPEAT,
               noise: float = DEFAULT_NOISE, start: int | float = 1, by_rate: bool = False,
               rate_resolution: float = RATE_RESOLUTION, min_rate: float = MIN_RATE,
               hold_s: float | None = None, at_least: bool = False) -> Next:
    """The next level to run (module docstring, "Choosing the next level")."""
    decisions = decisions_of(history, repeat, noise, by_rate, hold_s)
    again = sorted(lv for lv, d in decisions.items() if d == REPEAT)
    if again:
        why = ("passed: confirming it on a new arrival schedule" if by_rate and all(p.passed for p in history[again[0]])
               and not any(abs(_score(p) - 1.0) <= noise for p in history[again[0]])
               else "is within the noise of the target: repeating it")
        return Next(again[0], f"{level_name(again[0], by_rate)} {why}")
    lo, hi = _bracket(decisions)
    start = min(start, max_level)  # never a level above the cap, the first one included
    if hi is None:
        if lo is None:
            return Next(start, "first level")
        if lo >= max_level:
            return Next(None, f"{level_name(max_level, by_rate)} (the most allowed) passes")
        nxt = min(lo * 2, max_level)
        return Next(nxt, f"{level_name(lo, by_rate)} passes: doubling")
    if lo is None and at_least and start in decisions:  # only asked whether the capacity reaches start
        return Next(None, f"{level_name(start, by_rate)} does not pass: below it (--at-least), not searched downwards")
    if lo is None and by_rate:  # nothing passed yet: halve downwards until a rate passes
        lower = _round_rate(hi / 2)
        if lower < min_rate:
            return Next(None, f"{level_name(hi, True)} does not pass and nothing down to {level_name(min_rate, True)} was found "
                              "that does")
        return Next(lower, f"{level_name(hi, True)} does not pass: halving")
    if lo is None:
        if hi > start and start not in decisions:
            return Next(start, f"{level_name(hi, by_rate)} does not pass: trying {level_name(start, by_rate)}")
        if hi > 1:  # started above 1 (--start) and it failed: halve downwards until a level passes
            return Next(max(1, int(hi) // 2), f"{level_name(hi, by_rate)} does not pass: halving")
        return Next(None, f"{level_name(hi, by_rate)} does not pass and nothing below it does")
    if by_rate:
        if hi / lo <= 1 + rate_resolution:
            return Next(None, f"bracketed within {rate_resolution:.0%}")
        return Next(_round_rate((lo + hi) / 2), f"bisecting between {level_name(lo, True)} and {level_name(hi, True)}")
    if hi - lo <= 1:
        return Next(None, f"bracketed: {level_name(lo, False)} passes, {level_name(hi, False)} does not")
    return Next((lo + hi) // 2, f"bisecting between {level_name(lo, False)} and {level_name(hi, False)}")


def _round_rate(rate: float) -> float:
    """A rate to three significant digits (0.0625 -> 0.0625, 0.3333 -> 0.333): a level's name stays short."""
    return float(f"{rate:.3g}")


def level_name(level: int | float, by_rate: bool) -> str:
    """A level as the search's words name it: "c=4", "1.25 req/s"."""
    return f"{level:g} req/s" if by_rate else f"c={level:g}"


@dataclass(frozen=True, slots=True)
class Answer:
    """The search's answer (module docstring, "The answer")."""

    feasible_max: int | float | None
    infeasible_min: int | float | None
    inconclusive: tuple[int | float, ...]
    bracket_hi: int | float | None  # the lowest level that did not pass (fail or inconclusive)
    binding: str | None
    shape: str | None
    decisions: dict[int | float, str]
    # inconclusive rates whose every schedule passed, but a fresh one would not hold (holds_fresh)
    unsteady: tuple[int | float, ...] = ()


def _mean_ratios(probes: Sequence[Probe]) -> dict[str, float]:
    """Each target's mean ratio over the probes (inf when any probe's is infinite)."""
    out: dict[str, float] = {}
    for name in (probes[0].ratio if probes else {}):
        values = [v for p in probes if (v := p.ratio.get(name)) is not None]
        out[name] = math.inf if len(values) < len(probes) else sum(values) / len(values)
    return out


def _median_score(probes: Sequence[Probe]) -> float:
    scores = sorted(_score(p) for p in probes)
    return scores[(len(scores) - 1) // 2]


def binding_target(probes: Sequence[Probe]) -> str | None:
    """The target with the highest mean ratio at the quantile ("error" when every ratio is infinite
    because requests failed); ties go to the first target."""
    ratios = _mean_ratios(probes)
    if not ratios:
        return None
    if all(math.isinf(v) for v in ratios.values()):
        return "error"
    return max(ratios, key=lambda n: ratios[n])


def shape_of(lo: Sequence[Probe], hi: Sequence[Probe]) -> str | None:
    """CLIFF or SMOOTH between the last passing level's probes and the first failing one's."""
    if not lo or not hi:
        return None
    a, b = _median_score(lo), _median_score(hi)
    if math.isinf(b) or b > CLIFF_FACTOR * max(a, 1e-9):
        return CLIFF
    return SMOOTH


def conclude(history: Mapping[int | float, Sequence[Probe]], repeat: int = DEFAULT_REPEAT,
             noise: float = DEFAULT_NOISE, by_rate: bool = False, hold_s: float | None = None) -> Answer:
    """The answer from every probe made (module docstring)."""
    decisions = decisions_of(history, repeat, noise, by_rate, hold_s)
    lo, hi = _bracket(decisions)
    fails = sorted(lv for lv, d in decisions.items() if d == FAIL)
    at = history[hi] if hi is not None else history[lo] if lo is not None else ()
    return Answer(
        feasible_max=lo, infeasible_min=fails[0] if fails else None,
        inconclusive=tuple(sorted(lv for lv, d in decisions.items() if d == INCONCLUSIVE)),
        bracket_hi=hi, binding=binding_target(at),
        shape=shape_of(history[lo], history[hi]) if lo is not None and hi is not None else None,
        decisions=dict(sorted(decisions.items())),
        unsteady=tuple(sorted(lv for lv, d in decisions.items()
                              if d == INCONCLUSIVE and all(p.passed for p in history[lv]))))


# Decode is said to slow with the batch when the first failing level's per-request decode speed is
# this much below the last passing level's.
DECODE_SLOWER = 0.85


_F = TypeVar("_F", bound=msgspec.Struct)


class _Wait(msgspec.Struct, frozen=True):
    p50: float | None = None


class _LevelFacts(msgspec.Struct, frozen=True):
    """What `why` reads of a level's summary (`core.rundoc.Level`, or its dict as run.json holds it)."""

    errors_by_kind: dict[str, int] = {}
    decode_tok_s_mean: float | None = None


class _VerdictFacts(msgspec.Struct, frozen=True):
    """What `why` reads of a level of the saturation verdict (`core.rundoc.LevelVerdict`, or its dict)."""

    queue_cause: str | None = None
    slot_wait_ms: _Wait | None = None
    queued_wait_ms: _Wait | None = None
    queue_wait_ms: _Wait | None = None


def _facts(value: Any, cls: type[_F]) -> _F | None:
    return None if value is None else msgspec.convert(value, cls, from_attributes=True, strict=False)


def why(binding: str | None, lo: Any, hi: Any, hi_verdict: Any, total_slots: int | None) -> str:
    """Why the first failing level fails, from its run.json summary (`hi`), its saturation verdict
    level (`hi_verdict`: queue_cause, queue waits) and the last passing level's summary (`lo`), each
    typed (`core.rundoc.Level`, `LevelVerdict`) or as run.json holds it, or None:
    - requests failed (binding "error"): how many and of which kind;
    - its queued requests waited for a slot (queue_cause "slots"): the slots are full, with the
      median wait of the requests that queued;
    - they waited with a slot free, outside the server (queue_cause "outside"): the HTTP threads;
    - behind another request's prompt (queue_cause "prefill");
    - else per-request decode speed fell by more than 15% from lo: decode slows with the batch;
    - else "" (nothing in the evidence explains it)."""
    after = _facts(hi, _LevelFacts)
    if after is None:
        return ""
    if binding == "error":
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(after.errors_by_kind.items()))
        return f"requests fail ({kinds})" if kinds else "requests fail"
    v = _facts(hi_verdict, _VerdictFacts) or _VerdictFacts()
    waits = v.slot_wait_ms or v.queued_wait_ms or v.queue_wait_ms
    median = waits.p50 if waits is not None else None
    wait = f" (median {median:,.0f} ms)" if median is not None else ""
    if v.queue_cause == "slots":
        slots = ("its slot is" if total_slots == 1 else f"its {total_slots} slots are") if total_slots else \
            "its slots are"
        return f"{slots} full and requests queue{wait}"
    if v.queue_cause == "outside":
        return f"requests wait outside the server with a slot free{wait}: its HTTP threads (--threads-http)"
    if v.queue_cause == "prefill":
        return f"requests wait behind other requests' prompts{wait}"
    before = (_facts(lo, _LevelFacts) or _LevelFacts()).decode_tok_s_mean
    decode = after.decode_tok_s_mean
    if before is not None and decode is not None and before > 0 and decode < DECODE_SLOWER * before:
        return f"decode slows with the batch ({before:,.1f} → {decode:,.1f} tok/s per request)"
    return ""
