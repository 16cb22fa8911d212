"""The report's view model: every target of every run as one `TargetSeries`, what the HTML page,
its Markdown twin (`html.py`) and the charts (`charts.py`) draw from. Plain data; no drawing here.

With several runs a series is labelled `<dir name>: <target>`, and a run not marked complete says so
in every label. A soak's series also gives its windows over time (`soak_timeline`): run.json's
window throughput and errors, and each window's latency and TTFT percentiles from the records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
import numpy as np

from ..analysis import metrics
from ..analysis.energy import within_idle_noise
from ..analysis.metric_defs import LATENCY, TTFT
from ..analysis.slo import SloLevel
from ..core.records import ProbeSample, RequestRecord
from ..core.rundoc import Distribution, Level, RunDocument, RunKind, SoakSection, Target, Verdict
from .cache import kept_records, turn_tables
from .layout import Grid
from .router import summary_grid

INCOMPLETE = "incomplete"


def levels_by_value(levels: Sequence[Level]) -> list[Level]:
    """Levels in the order of their value (concurrency or request rate), as a chart's line joins them:
    a capacity search probes 1, 2, 4, 8, 6, 5, and a line in that order zigzags. A level that ran more
    than once keeps each run as its own point, side by side at the same value in the order they ran
    (a sort that is stable), not pooled: each run's figures are run.json's own."""
    return sorted(levels, key=lambda lv: lv.level)


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
    kind: RunKind = RunKind.SWEEP
    tables: list[Grid] = field(default_factory=list)  # tables drawn from its records: a chat run's per turn
    answer: str | None = None  # its run's answer (RunSource.answer)

    @property
    def soak(self) -> SoakSection | None:
        return self.target.soak if self.kind is RunKind.SOAK else None

    @property
    def levels(self) -> list[Level]:
        """The levels in the order they ran (the tables' order)."""
        return list(self.target.levels)

    @property
    def chart_levels(self) -> list[Level]:
        """The levels as the charts draw them: `levels_by_value`."""
        return levels_by_value(self.target.levels)

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


    def soak_timeline(self) -> SoakTimeline:
        """The soak's windows as columns: run.json's counts, and per window the latency and TTFT
        distributions of the successful requests that completed in it (cut by completion time from
        the first request's start, the last window taking what ends after it, as analysis/soak.py)."""
        soak = self.soak
        windows = list(soak.windows) if soak else []
        latency: list[list[float]] = [[] for _ in windows]
        ttft: list[list[float]] = [[] for _ in windows]
        ok = [r for r in self.records if r.ok]
        if windows and ok and soak is not None and soak.window_s:
            t0 = min(r.start_ns for r in self.records)
            for r in ok:
                i = min(len(windows) - 1, max(0, int((r.complete_ns - t0) / 1e9 // soak.window_s)))
                latency[i] += LATENCY.values(r)
                ttft[i] += TTFT.values(r)
        return SoakTimeline(
            start_s=[w.start_s for w in windows], end_s=[w.end_s for w in windows],
            throughput_tok_s=[w.throughput_tok_s for w in windows], requests_ok=[w.requests_ok for w in windows],
            requests_failed=[w.requests_failed for w in windows],
            errors=[", ".join(f"{k} ×{n}" for k, n in w.errors_by_kind.items()) or "none" for w in windows],
            latency_ms=[metrics.distribution_ms(v) for v in latency], ttft_ms=[metrics.distribution_ms(v) for v in ttft],
            window_s=(soak.window_s or 0.0) if soak else 0.0, drift_windows=(soak.drift_windows or 0) if soak else 0,
            first_throughput_tok_s=soak.first_throughput_tok_s if soak else None,
            last_throughput_tok_s=soak.last_throughput_tok_s if soak else None,
            attainment=[w.attainment for w in windows],
            required_attainment=soak.slo.required if soak is not None and soak.slo is not None else None)


@dataclass(frozen=True)
class SoakTimeline:
    """A soak's windows as columns (seconds since the soak's start); a distribution is None where the
    window had no value (no successful request, or no TTFT without streaming)."""

    start_s: list[float]
    end_s: list[float]
    throughput_tok_s: list[float]
    requests_ok: list[int]
    requests_failed: list[int]
    errors: list[str]
    latency_ms: list[Distribution | None]
    ttft_ms: list[Distribution | None]
    window_s: float = 0.0
    drift_windows: int = 0  # k: the first and last k full windows compared for drift
    first_throughput_tok_s: float | None = None
    last_throughput_tok_s: float | None = None
    # --slo: each window's good / judged requests (None: nothing judged, or no SLO), and the share required
    attainment: list[float | None] = field(default_factory=list)
    required_attainment: float | None = None

    @property
    def middle_s(self) -> list[float]:
        return [(a + b) / 2 for a, b in zip(self.start_s, self.end_s)]

    @property
    def partial(self) -> list[bool]:
        """Whether each window is shorter than the others (the last one, cut by the soak's end)."""
        return [b - a < self.window_s * 0.999 for a, b in zip(self.start_s, self.end_s)]

    def time_unit(self) -> tuple[str, float]:
        """The unit the time axis reads best in, and its length in seconds: s, min beyond 10 minutes,
        h beyond 3 hours."""
        end = self.end_s[-1] if self.end_s else 0.0
        return ("h", 3600.0) if end > 3 * 3600 else ("min", 60.0) if end > 600 else ("s", 1.0)

    def in_unit(self, seconds: list[float]) -> list[float]:
        return [t / self.time_unit()[1] for t in seconds]

    def stat(self, name: str, metric: str = "latency_ms") -> list[float | None]:
        """One statistic (p50, p99, ...) of a distribution column per window; None where it has none."""
        return [None if d is None else getattr(d, name) for d in getattr(self, metric)]

    def drift_spans(self) -> list[tuple[float, float, float]]:
        """(from s, to s, mean tok/s) of the first and the last k full windows the drift compares
        (analysis/soak.py); none when the soak was too short to have them."""
        full = [i for i, (a, b) in enumerate(zip(self.start_s, self.end_s)) if b - a >= self.window_s * 0.999]
        k = self.drift_windows
        if not k or len(full) < 2 or self.first_throughput_tok_s is None or self.last_throughput_tok_s is None:
            return []
        first, last = full[:k], full[-k:]
        return [(self.start_s[first[0]], self.end_s[first[-1]], self.first_throughput_tok_s),
                (self.start_s[last[0]], self.end_s[last[-1]], self.last_throughput_tok_s)]

    @property
    def has_ttft(self) -> bool:
        return any(d is not None for d in self.ttft_ms)


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


def level_extras(series: Sequence[TargetSeries]) -> tuple[bool, bool]:
    """(any level drafted or any server said it speculates, any level's requests reasoned): whether the
    report shows speculation and reasoning at all (a run with neither shows neither)."""
    levels = [lv for s in series for lv in s.levels]
    speculates = any(s.target.server is not None and s.target.server.speculative for s in series)
    return (any(lv.draft_n is not None for lv in levels) or speculates,
            any(lv.reasoning_tokens is not None for lv in levels))


def level_slo(level: Level) -> SloLevel | None:
    """The level judged against the run's latency targets (run.json's "slo"), None without --slo."""
    return msgspec.convert(level.slo, SloLevel) if level.slo else None


def has_slo(series: Sequence[TargetSeries]) -> bool:
    """Whether any level was judged against latency targets (--slo): the report then shows attainment
    and goodput, and the attainment chart; a report of runs without --slo shows neither."""
    return any(lv.slo for s in series for lv in s.levels)


def attainment_points(s: TargetSeries) -> tuple[list[int | float], list[float | None], float | None]:
    """(levels, attainment in % or None where nothing was judged, the required attainment in % or
    None) of one series' judged levels, for the attainment chart."""
    judged = [(lv.level, j) for lv in s.chart_levels if (j := level_slo(lv)) is not None]
    return ([level for level, _ in judged], [None if j.attainment is None else 100 * j.attainment for _, j in judged],
            100 * judged[0][1].required if judged else None)


def has_energy(series: Sequence[TargetSeries]) -> bool:
    """Whether any level has energy figures (--environment on a machine with RAPL or NVML counters):
    the report then shows energy per token in its level table and the energy chart."""
    return any(lv.energy for s in series for lv in s.levels)


def has_machine_changes(series: Sequence[TargetSeries]) -> bool:
    """Whether the machine changed during any level: the level table then marks those levels."""
    return any(lv.machine_changed for s in series for lv in s.levels)


@dataclass(frozen=True)
class EnergyPoints:
    """One series' levels with energy figures (core/rundoc.py `headline_energy`), as columns; None
    where a level has no such figure (no output tokens, or no idle power for the net one; a net at or
    below zero is idle noise, analysis/energy.within_idle_noise, and draws no point)."""

    levels: list[int | float]
    j_per_token: list[float | None]
    net_j_per_token: list[float | None]
    mean_w: list[float | None]
    changed: list[bool]  # the machine changed during the level


def energy_points(s: TargetSeries) -> EnergyPoints:
    measured = [(lv, e) for lv in s.chart_levels if (e := lv.headline_energy) is not None]
    return EnergyPoints(levels=[lv.level for lv, _ in measured], j_per_token=[e.j_per_token for _, e in measured],
                        net_j_per_token=[None if within_idle_noise(e.net_j_per_token) else e.net_j_per_token
                                         for _, e in measured],
                        mean_w=[e.mean_w for _, e in measured], changed=[lv.machine_changed for lv, _ in measured])


def has_soak_slo(series: Sequence[TargetSeries]) -> bool:
    """Whether any soak was judged against latency targets: its report then draws attainment per window."""
    return any(s.soak is not None and s.soak.slo is not None for s in series)


def percentile_curve(values_ms: Sequence[float], points: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """(1/(1-p), latency ms) for p from 0 to 99.99%, read from an HdrHistogram as HdrHistogram plots do."""
    histogram = metrics.histogram_ms(values_ms)
    quantiles = 1 - np.logspace(0, -4, points)  # 0 .. 0.9999, denser towards the tail
    ys = np.array([histogram.get_value_at_percentile(q * 100) / 1000 for q in quantiles])
    return 1 / (1 - quantiles), ys


@dataclass(frozen=True)
class RunSource:
    """One results directory as a report reads it: its name, its run (typed), its records and probe samples."""

    name: str
    run: RunDocument
    records: Sequence[RequestRecord]
    probe: Sequence[ProbeSample]
    answer: str | None = None  # the run kind's answer in one sentence (a capacity run's), said first
    tables: Sequence[Grid] = ()  # tables of the folder it belongs to (a cache-capacity folder's per K), shown with it


def build_series(sources: Sequence[RunSource]) -> list[TargetSeries]:
    """One series per target of each results directory, in the order given."""
    several = len(sources) > 1
    series = []
    for source in sources:
        run = source.run
        complete = run.complete
        for target in run.targets:
            name = target.label
            records = [r for r in source.records if r.target == name]
            label = f"{source.name}: {name}" if several else name
            if not complete:
                label += f" ({INCOMPLETE})"
            series.append(TargetSeries(
                label=label, run_name=source.name, target=target, complete=complete, open_loop=run.open_loop,
                kind=run.kind, answer=source.answer,
                records=records, probe=[s for s in source.probe if s.target == name],
                tables=[*source.tables, *turn_tables(run, kept_records(run, records)),
                        *([summary_grid(target.router)] if target.router else [])]))
    return series
