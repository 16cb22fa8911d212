"""A figure over builds or over time, from the history store's rows (`loadgen history trend`). Pure.

Only rows of the newest run's identity are drawn (analysis/history_check.py: kind, target, model,
workload, machine; a fact unknown on either side is not a difference), at one level: a trend that
mixed two questions would show their difference as a change. By build, each build_info's runs, in
the order the builds first appear, give mean ± sd and the change of the mean against the build
before; by time, each run is a point and its change is against the run before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .history_check import RunIdentity

# The figures a history row keeps (results/history.py LEVEL_COLUMNS), with their units; higher is
# better for the first two.
FIGURES = {"throughput_tok_s": "tok/s", "request_rate": "req/s", "latency_ms_p50": "ms", "latency_ms_p99": "ms",
           "ttft_ms_p50": "ms", "ttft_ms_p99": "ms"}
HIGHER_IS_BETTER = frozenset({"throughput_tok_s", "request_rate"})


@dataclass(frozen=True, slots=True)
class TrendRow:
    """One run's row of the store at one level: who it is, its build and the figure."""

    run: RunIdentity
    build: str | None
    level: float
    value: float | None


@dataclass(frozen=True, slots=True)
class Point:
    """A build (or one run), its runs, the figure's mean and sd over them, and the change of the mean
    against the point before (None for the first)."""

    name: str
    started_utc: str
    runs: int
    mean: float
    sd: float | None
    change: float | None


@dataclass(frozen=True, slots=True)
class Trend:
    points: tuple[Point, ...]
    left_out: int  # rows of the target and level whose identity differs from the newest run's


def trend(rows: Sequence[TrendRow], by_build: bool = True) -> Trend:
    """The points of the newest row's identity (module docstring), oldest first."""
    ordered = sorted((r for r in rows if r.value is not None and math.isfinite(r.value)),
                     key=lambda r: (r.run.started_utc, r.run.run_id))
    if not ordered:
        return Trend((), 0)
    newest = ordered[-1].run
    alike = [r for r in ordered if not newest.differs(r.run)]
    groups: dict[str, list[TrendRow]] = {}
    for r in alike:
        key = (r.build or "unknown build") if by_build else f"{r.run.started_utc} #{r.run.run_id}"
        groups.setdefault(key, []).append(r)
    points: list[Point] = []
    for name, members in groups.items():
        values = [m.value for m in members if m.value is not None]
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
        before = points[-1].mean if points else None
        change = None if before in (None, 0) else mean / before - 1
        points.append(Point(name, members[0].run.started_utc, len(values), mean, sd, change))
    return Trend(tuple(points), len(ordered) - len(alike))
