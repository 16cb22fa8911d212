"""The report's view model: every target of every run as one `TargetSeries`, what the HTML page,
its Markdown twin (`html.py`) and the charts (`charts.py`) draw from. Plain data; no drawing here.

With several runs a series is labelled `<dir name>: <target>`, and a run not marked complete says so
in every label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..analysis import metrics
from ..core.records import ProbeSample, RequestRecord
from ..core.rundoc import Level, RunDocument, Target, Verdict

INCOMPLETE = "incomplete"


@dataclass
class TargetSeries:
    """One target of one run, as drawn and tabulated."""

    label: str
    run_name: str
    target: Target
    records: list[RequestRecord] = field(default_factory=list)
    probe: list[ProbeSample] = field(default_factory=list)
    complete: bool = True
    open_loop: bool = False  # its run's levels are request rates (core.rundoc.is_open_loop)

    @property
    def levels(self) -> list[Level]:
        return list(self.target.levels)

    @property
    def total_slots(self) -> int | None:
        return None if self.target.server is None else self.target.server.total_slots

    @property
    def verdict(self) -> Verdict:
        return self.target.verdict or Verdict()

    def latencies_ms(self, level: int | float) -> list[float]:
        """Latency of each successful request of one level (metrics.latency_ms)."""
        return [metrics.latency_ms(r) for r in self.records if r.level == level and r.ok]

    def decode_speeds(self, level: int | float) -> list[float]:
        """Decode tok/s of each request of one level that has one (metrics.decode_tok_s)."""
        return [v for r in self.records if r.level == level and (v := metrics.decode_tok_s(r)) is not None]

    def probe_timeline(self) -> ProbeTimeline:
        """The probe samples in time order, time in seconds since the first one."""
        samples = sorted(self.probe, key=lambda p: p.t_ns)
        t0 = samples[0].t_ns if samples else 0
        return ProbeTimeline(
            seconds=[(p.t_ns - t0) / 1e9 for p in samples], levels=[p.level for p in samples],
            busy_slots=[p.busy_slots for p in samples], requests_deferred=[p.requests_deferred for p in samples])


@dataclass(frozen=True)
class ProbeTimeline:
    """One series' probe samples as columns; None where the endpoint was off."""

    seconds: list[float]
    levels: list[int | float]
    busy_slots: list[int | None]
    requests_deferred: list[float | None]

    def level_starts(self) -> list[tuple[float, int | float]]:
        """(seconds, level) of the first sample of each level, in order."""
        starts: list[tuple[float, int | float]] = []
        for t, level in zip(self.seconds, self.levels):
            if not starts or starts[-1][1] != level:
                starts.append((t, level))
        return starts


def percentile_curve(values_ms: Sequence[float], points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(1/(1-p), latency ms) for p from 0 to 99.99%, read from an HdrHistogram as HdrHistogram plots do."""
    histogram = metrics.histogram_ms(values_ms)
    quantiles = 1 - np.logspace(0, -4, points)  # 0 .. 0.9999, denser towards the tail
    ys = np.array([histogram.get_value_at_percentile(q * 100) / 1000 for q in quantiles])
    return 1 / (1 - quantiles), ys


def build_series(sources: Sequence[dict[str, Any]]) -> list[TargetSeries]:
    """sources: {"name", "run", "records", "probe"} per results directory, in the order given."""
    several = len(sources) > 1
    series = []
    for source in sources:
        run = RunDocument.of(source["run"])
        complete = run.complete
        for target in run.targets:
            name = target.label
            label = f"{source['name']}: {name}" if several else name
            if not complete:
                label += f" ({INCOMPLETE})"
            series.append(TargetSeries(
                label=label, run_name=source["name"], target=target, complete=complete, open_loop=run.open_loop,
                records=[r for r in source["records"] if r.target == name],
                probe=[s for s in source["probe"] if s.target == name]))
    return series
