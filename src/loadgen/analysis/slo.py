"""Latency targets (an SLO), each request judged against them, and a level's attainment and goodput.

Pure functions over recorded data: no I/O, no clock.

Targets (`--slo ttft=500ms,tpot=50ms,e2e=8s,itl=100ms,queue=1s`, any subset), per request, each
from analysis/metrics.py's definition:
- ttft  = metrics.ttft_ms(r)           (needs --stream)
- ttfa  = metrics.ttfa_ms(r)           (needs --stream: the first answer token, after any reasoning)
- tpot  = metrics.tpot_ms(r)           (needs --stream and 2+ generated tokens)
- e2e   = metrics.latency_ms(r)
- itl   = max(metrics.itl_ms(r)): the request's longest gap between content chunks, so "itl=100ms"
          means no pause longer than 100 ms (needs --stream)
- queue = metrics.queue_wait_ms(r)     (needs the server's timings)

A request is *good* when it succeeded and every target's value is at most the target. A failed
request (any error kind) always misses ("error"); a successful one missing a value a target needs
misses too ("unjudged", counted and named, never counted good). Requests the client cancelled or
lost are neither (they are not the server's doing) and are not judged.

Per level, over the n judged requests:
- attainment    = good / n (None when n = 0); the level *passes* when attainment >= the required
                  attainment (`--attainment`, default 0.9).
- goodput_req_s = good / wall_s; goodput_tok_s = output tokens of the good requests / wall_s
                  (wall_s: metrics.level_wall_s, the level's).
- misses        = per target, how many requests exceeded it (a request may miss several), plus
                  "error" and "unjudged"; most_missed = the target missed most (ties: the order the
                  targets were given; "error" and "unjudged" only when no target was missed).
- ratio         = per target, the value over the target at the attainment quantile: the value of
                  rank ceil(q·n) among the judged requests' value/target (q: the required
                  attainment; an error or a missing value counts as infinitely late). score = the
                  same of each request's worst ratio over all targets. score <= 1 exactly when the
                  level passes; how far below or above 1 it lies is the level's margin, which the
                  capacity search weighs against the run-to-run noise (analysis/capacity_search.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..core.records import CLIENT_SIDE, RequestRecord

# Target names in the order tables show them, each with its per-request value.
TARGETS = ("ttft", "ttfa", "tpot", "itl", "e2e", "queue")
DEFAULT_ATTAINMENT = 0.9
ERROR = "error"
UNJUDGED = "unjudged"
# Targets whose value exists only for a streamed response.
STREAM_TARGETS = frozenset({"ttft", "ttfa", "tpot", "itl"})

_UNITS_MS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}
_ITEM = re.compile(r"^\s*([a-z][a-z0-9]*)\s*[=:]\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(us|µs|ms|s|m)?\s*$", re.IGNORECASE)


class SloError(ValueError):
    """A latency target that cannot be parsed; its message is one sentence for the user."""


@dataclass(frozen=True, slots=True)
class Slo:
    """Latency targets in ms, by name (a subset of TARGETS), and the attainment a level must reach."""

    targets_ms: tuple[tuple[str, float], ...]
    attainment: float = DEFAULT_ATTAINMENT

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.targets_ms)

    @property
    def needs_stream(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n in STREAM_TARGETS)

    def text(self) -> str:
        """The targets as a user reads them: "ttft≤500 ms, tpot≤50 ms"."""
        return ", ".join(f"{name}≤{_ms_text(ms)}" for name, ms in self.targets_ms)

    def to_dict(self) -> dict[str, object]:
        return {"targets_ms": dict(self.targets_ms), "attainment": self.attainment}


def _ms_text(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def parse_slo(text: str, attainment: float = DEFAULT_ATTAINMENT) -> Slo:
    """"ttft=500ms,tpot=50ms,e2e=8s" -> Slo, in TARGETS order. A bare number is milliseconds.
    Raises SloError on an unknown name, a repeated one, a missing, non-positive or non-finite value
    (1e400 reads as infinity: a target nothing can miss, so no level could fail it)."""
    if not 0 < attainment <= 1:
        raise SloError(f"--attainment {attainment:g} is not a share in (0, 1]; give e.g. 0.9")
    found: dict[str, float] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        m = _ITEM.match(item)
        if m is None:
            raise SloError(f"--slo: cannot read {item.strip()!r}; write NAME=VALUE with a unit, e.g. ttft=500ms")
        name, value, unit = m.group(1).lower(), float(m.group(2)), (m.group(3) or "ms").lower()
        if name not in TARGETS:
            raise SloError(f"--slo: unknown target {name!r}; known: {', '.join(TARGETS)}")
        if name in found:
            raise SloError(f"--slo: {name} given twice")
        ms = value * _UNITS_MS[unit]
        if not ms > 0:
            raise SloError(f"--slo: {name} must be above 0")
        if not math.isfinite(ms):
            raise SloError(f"--slo: {item.strip()!r} is not a finite time; give a target a request can miss, "
                           f"e.g. {name}=8s")
        found[name] = ms
    if not found:
        raise SloError("--slo: no target given; e.g. --slo ttft=500ms,tpot=50ms")
    return Slo(tuple((n, found[n]) for n in TARGETS if n in found), attainment)


_METRICS: list[Any] = []  # analysis.metrics once first asked for (value_ms): reading --slo's grammar loads no numpy


def _metrics():  # the module, imported on the first request judged, not on every one
    if not _METRICS:
        from . import metrics

        _METRICS.append(metrics)
    return _METRICS[0]


def value_ms(r: RequestRecord, name: str) -> float | None:
    """The request's value for target `name` (see the module docstring), None when unknown."""
    metrics = _METRICS[0] if _METRICS else _metrics()

    if name == "ttft":
        return metrics.ttft_ms(r)
    if name == "ttfa":
        return metrics.ttfa_ms(r)
    if name == "tpot":
        return metrics.tpot_ms(r)
    if name == "itl":
        gaps = metrics.itl_ms(r)
        return max(gaps) if gaps else None
    if name == "e2e":
        return metrics.latency_ms(r)
    if name == "queue":
        return metrics.queue_wait_ms(r)
    raise KeyError(name)


def judge(r: RequestRecord, slo: Slo) -> tuple[str, ...]:
    """What request `r` missed: () when good; ("error",) when it failed; the targets it exceeded,
    with "unjudged" when a value a target needs is missing. Not for client-side records."""
    if not r.ok:
        return (ERROR,)
    missed: list[str] = []
    unjudged = False
    for name, target in slo.targets_ms:
        v = value_ms(r, name)
        if v is None:
            unjudged = True
        elif v > target:
            missed.append(name)
    return (*missed, UNJUDGED) if unjudged else tuple(missed)


def _ratios(r: RequestRecord, slo: Slo) -> list[float]:
    """value / target per target (inf for an error or a missing value), in the targets' order."""
    if not r.ok:
        return [math.inf] * len(slo.targets_ms)
    out = []
    for name, target in slo.targets_ms:
        v = value_ms(r, name)
        out.append(math.inf if v is None else v / target)
    return out


class SloLevel(msgspec.Struct, frozen=True, kw_only=True):
    """A level judged against an SLO, as run.json stores it (each level's "slo")."""

    judged: int
    good: int
    attainment: float | None
    required: float
    passed: bool
    goodput_req_s: float
    goodput_tok_s: float
    misses: dict[str, int]
    most_missed: str | None
    ratio: dict[str, float | None]  # per target, at the attainment quantile; None: infinite
    score: float | None  # the worst ratio at the quantile; None: infinite (more than 1-q errored)

    def to_dict(self) -> dict[str, object]:
        return msgspec.to_builtins(self)


def _quantile(values: Sequence[float], q: float) -> float:
    """The value of rank ceil(q·n) in sorted order (n > 0)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered) - 1e-9))
    return ordered[rank - 1]


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


@dataclass(slots=True)
class SloTally:
    """A level's judged requests gathered batch by batch (a `stream_level` consumer): counts, and each
    judged request's ratios (a few floats a request) for the quantiles."""

    slo: Slo
    judged: int = 0
    good: int = 0
    good_tokens: int = 0
    misses: dict[str, int] = field(default_factory=dict)
    ratios: list[list[float]] = field(default_factory=list)

    def add(self, batch: Iterable[RequestRecord]) -> None:
        # judge() and _ratios() in one pass: each target's value read once a request
        targets, misses, inf = self.slo.targets_ms, self.misses, math.inf
        for r in batch:
            if r.error_kind in CLIENT_SIDE:
                continue
            self.judged += 1
            if not r.ok:
                misses[ERROR] = misses.get(ERROR, 0) + 1
                self.ratios.append([inf] * len(targets))
                continue
            row, good, unjudged = [], True, False
            for name, target in targets:
                v = value_ms(r, name)
                if v is None:
                    unjudged, good = True, False
                    row.append(inf)
                    continue
                row.append(v / target)
                if v > target:
                    good = False
                    misses[name] = misses.get(name, 0) + 1
            if unjudged:
                misses[UNJUDGED] = misses.get(UNJUDGED, 0) + 1
            if good:
                self.good += 1
                self.good_tokens += r.output_tokens or 0
            self.ratios.append(row)

    @classmethod
    def of(cls, slo: Slo, rs: Iterable[RequestRecord]) -> SloTally:
        tally = cls(slo)
        tally.add(rs)
        return tally

    def result(self, wall_s: float) -> SloLevel:
        """The level's attainment, goodput and margins (see the module docstring)."""
        slo, q = self.slo, self.slo.attainment
        attainment = self.good / self.judged if self.judged else None
        per_target: dict[str, float | None] = {}
        score: float | None = None
        if self.judged:
            for i, name in enumerate(slo.names):
                per_target[name] = _finite(_quantile([row[i] for row in self.ratios], q))
            score = _finite(_quantile([max(row) for row in self.ratios], q))
        else:
            per_target = {name: None for name in slo.names}
        order = [n for n in slo.names if self.misses.get(n)] or [n for n in (ERROR, UNJUDGED) if self.misses.get(n)]
        most = max(order, key=lambda n: self.misses[n]) if order else None  # max keeps the first of ties
        return SloLevel(
            judged=self.judged, good=self.good, attainment=attainment, required=q,
            passed=attainment is not None and attainment >= q,
            goodput_req_s=self.good / wall_s if wall_s > 0 else 0.0,
            goodput_tok_s=self.good_tokens / wall_s if wall_s > 0 else 0.0,
            misses={n: self.misses[n] for n in (*slo.names, ERROR, UNJUDGED) if self.misses.get(n)},
            most_missed=most, ratio=per_target, score=score)


def judge_level(slo: Slo, rs: Sequence[RequestRecord]) -> SloLevel:
    """A level's `SloLevel` from its records (wall time: metrics.level_wall_s)."""
    from . import metrics

    return SloTally.of(slo, rs).result(metrics.level_wall_s(rs))
