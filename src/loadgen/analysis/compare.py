"""Are the candidate runs different from the baseline runs? Pure statistics over two sides: no I/O.

A side is one run or several runs of one configuration (each a run.json document plus its
request records; see results/). The unit of evidence is the run (analysis/between_runs.py): each
run gives one value per target, level and metric, recomputed from its records with the
definitions in analysis/metrics.py (requests cancelled by the user left out):

- throughput      output tokens per second of the level (`metrics.throughput_tok_s`).
- latency_p50, latency_p99, queue_wait_p50, decode_tok_s (median per request), and asked by name
  ttft_p50, ttft_p99, tpot_p50, tpot_p99, queue_wait_p99 (streaming runs): the percentile
                  of the run's successful requests, rank round(q * n) (HdrHistogram's definition,
                  so the figures agree with run.json and `report`).
- goodput, attainment (asked by name): requests a second that met every --slo target, and their
                  share of the level's judged requests (analysis/slo.py `judge_level`), judged
                  against the --slo both sides' runs were made with (refused when they differ).
- error_rate      failed / (ok + failed) over the side's runs; significance from Fisher's exact
                  test on the pooled 2x2 counts (a failure is a request's outcome, not a run's).

A side's value is the geometric mean of its runs' values (the run's own value when there is
one). A difference is significant when the between-runs test's interval of candidate / baseline
excludes 1: paired when the two sides' runs were recorded interleaved, pooled otherwise, with a
calibrated noise floor when one is given; with one run a side and no floor there is no test
(`significant = None`, which callers must not read as "no change"). One policy for `compare`
and `gate`: with k checks (metrics x levels, error rate included in compare), each is tested at
1 - (1 - confidence) / k (Bonferroni), so on unchanged servers the chance that any of them is
called a change stays below 1 - confidence.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from scipy import stats

from ..core.errors import UserError
from ..core.records import CLIENT_SIDE, RequestRecord
from ..core.rundoc import CacheMode, Config, RunDocument, RunKind
from . import metrics
from .between_runs import Floor, RunEffect, calibrate, interleaved, run_effect
from .slo import Slo, judge_level

CONFIG_MUST_MATCH = ("api", "mode", "stream", "prompt", "n_predict", "ignore_eos", "workload", "cache", "classes")


class CompareError(UserError, ValueError):
    """The two runs cannot be compared; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    title: str
    unit: str
    higher_is_better: bool


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("throughput", "throughput", "tok/s", True),
    Metric("latency_p50", "latency p50", "ms", False),
    Metric("latency_p99", "latency p99", "ms", False),
    Metric("queue_wait_p50", "queue wait p50", "ms", False),
    Metric("decode_tok_s", "decode tok/s p50", "tok/s", True),
    Metric("error_rate", "error rate", "", False),
    # streaming runs: asked by name (gate --metric ttft_p99, compare --metric), not compared by default
    Metric("ttft_p50", "TTFT p50", "ms", False),
    Metric("ttft_p99", "TTFT p99", "ms", False),
    Metric("tpot_p50", "TPOT p50", "ms", False),
    Metric("tpot_p99", "TPOT p99", "ms", False),
    Metric("queue_wait_p99", "queue wait p99", "ms", False),
    # judged against the runs' --slo: asked by name (gate --metric goodput)
    Metric("goodput", "goodput", "req/s", True),
    Metric("attainment", "SLO attainment", "", True),
)}
SLO_METRICS = ("goodput", "attainment")
# What compare and calibrate check when no metric is named: the first six (one Bonferroni share
# each); the rest are there to be asked for.
DEFAULT_COMPARED = ("throughput", "latency_p50", "latency_p99", "queue_wait_p50", "decode_tok_s", "error_rate")


# the per-request figure behind each per-request metric (successful requests only)
PER_REQUEST: dict[str, Callable[[RequestRecord], float | None]] = {
    "latency_p50": metrics.latency_ms,
    "latency_p99": metrics.latency_ms,
    "queue_wait_p50": metrics.queue_wait_ms,
    "decode_tok_s": metrics.decode_tok_s,
    "ttft_p50": metrics.ttft_ms,
    "ttft_p99": metrics.ttft_ms,
    "tpot_p50": metrics.tpot_ms,
    "tpot_p99": metrics.tpot_ms,
    "queue_wait_p99": metrics.queue_wait_ms,
}


@dataclass(frozen=True, slots=True)
class MetricComparison:
    """One metric of one level: both values, and whether the difference is more than noise."""

    metric: str
    target: str
    concurrency: int
    baseline: float | None
    candidate: float | None
    n_baseline: int  # runs (error_rate: finished requests)
    n_candidate: int
    p_value: float | None = None  # the between-runs t test, or Fisher (error rate)
    ci_low: float | None = None  # interval of candidate / baseline (between runs)
    ci_high: float | None = None
    significant: bool | None = None  # None: no test (one run a side and no noise floor, or no value)
    note: str | None = None
    method: str | None = None  # how the run-to-run noise was known: paired, unpaired, noise floor
    detectable: float | None = None  # the smallest relative change these runs detect (80% power)

    @property
    def spec(self) -> Metric:
        return METRICS[self.metric]

    @property
    def ratio(self) -> float | None:
        """candidate / baseline; None when either is missing or the baseline is 0."""
        if self.baseline is None or self.candidate is None or self.baseline == 0:
            return None
        return self.candidate / self.baseline

    @property
    def change(self) -> float | None:
        """Relative change (+0.10 is +10%); for error_rate the absolute difference of the rates."""
        if self.metric == "error_rate":
            if self.baseline is None or self.candidate is None:
                return None
            return self.candidate - self.baseline
        ratio = self.ratio
        return None if ratio is None else ratio - 1.0

    @property
    def worse(self) -> bool:
        """The candidate's value is worse than the baseline's, however slightly."""
        change = self.change
        if change is None:
            return False
        return change < 0 if self.spec.higher_is_better else change > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric, "target": self.target, "concurrency": self.concurrency,
            "baseline": self.baseline, "candidate": self.candidate, "change": self.change,
            "n_baseline": self.n_baseline, "n_candidate": self.n_candidate,
            "p_value": self.p_value, "ci_low": self.ci_low, "ci_high": self.ci_high,
            "significant": self.significant, "note": self.note, "method": self.method,
            "detectable": self.detectable,
        }


@dataclass(frozen=True, slots=True)
class LevelComparison:
    target: str
    concurrency: int | float  # the level: a concurrency, or an open loop's rate
    metrics: tuple[MetricComparison, ...]

    def get(self, metric: str) -> MetricComparison:
        return next(m for m in self.metrics if m.metric == metric)


@dataclass(frozen=True, slots=True)
class RunComparison:
    confidence: float  # of the whole comparison
    levels: tuple[LevelComparison, ...]
    skipped: tuple[str, ...] = ()  # "<label> at concurrency 8: only in the candidate"
    warnings: tuple[str, ...] = ()
    check_confidence: float = 0.95  # what each check was tested at (Bonferroni)
    runs: tuple[int, int] = (1, 1)  # runs on each side
    paired: bool = False  # the sides were recorded interleaved
    floor: str | None = None  # where the noise floor came from, if one was used

    def to_dict(self) -> dict[str, Any]:
        return {
            "confidence": self.confidence, "check_confidence": self.check_confidence,
            "runs": list(self.runs), "paired": self.paired, "noise_floor": self.floor,
            "levels": [{"target": lv.target, "concurrency": lv.concurrency,
                        "metrics": [m.to_dict() for m in lv.metrics]} for lv in self.levels],
            "skipped": list(self.skipped),
            "warnings": list(self.warnings),
        }


# ---------------------------------------------------------------- statistics on plain samples


def rank_index(n: int, q: float) -> int:
    """0-based index, in sorted order, of the q-quantile of n values: rank round(q·n), at least 1.

    This is HdrHistogram's definition, the one behind run.json's p50/p99: p50 of 1..4 is 2, and
    p99 of 50 values or fewer is their maximum.
    """
    return max(1, min(n, int(q * n + 0.5))) - 1


def quantile(values: Sequence[float], q: float) -> float:
    ordered = np.sort(np.asarray(values, dtype=float))
    return float(ordered[rank_index(len(ordered), q)])


@dataclass(frozen=True, slots=True)
class RunData:
    """One run of a side: its run.json document (as read, and `typed`) and its request records."""

    doc: Mapping[str, Any]
    records: Sequence[RequestRecord]
    typed: RunDocument = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "typed", RunDocument.of(dict(self.doc)))

    @property
    def started(self) -> str:
        return self.typed.started_utc or ""


@dataclass(frozen=True, slots=True)
class NoiseFloors:
    """Calibrated run-to-run noise: per (metric, target, level), else per metric over all levels."""

    exact: Mapping[tuple[str, str, int | float], Floor] = field(default_factory=dict)
    by_metric: Mapping[str, Floor] = field(default_factory=dict)
    source: str = "calibration"

    def lookup(self, metric: str, target: str, level: int | float) -> Floor | None:
        return self.exact.get((metric, target, level)) or self.by_metric.get(metric)


def noise_floors(runs: Sequence[RunData], *, only: Iterable[str] | None = None,
                 source: str = "calibration") -> NoiseFloors:
    """The run-to-run noise of runs of one unchanged configuration (an A/A calibration), per metric,
    target and level, and per metric over all of them: between_runs.calibrate over the runs in
    the order they ran (successive differences)."""
    ordered = sorted(runs, key=lambda r: r.started)
    chosen = [n for n in (DEFAULT_COMPARED if only is None else METRICS)
              if n != "error_rate" and (only is None or n in set(only))]
    slo = shared_slo(ordered, []) if any(n in SLO_METRICS for n in chosen) else None
    by_level = [_by_level(r.records) for r in ordered]
    keys = sorted({key for levels in by_level for key in levels}, key=lambda k: (k[0], k[1]))
    exact: dict[tuple[str, str, int | float], Floor] = {}
    by_metric: dict[str, Floor] = {}
    for metric in chosen:
        groups = []
        for key in keys:
            values = [level_value(metric, levels[key], slo) for levels in by_level if key in levels]
            group = [v for v in values if v is not None]
            floor = calibrate([group])
            if floor is not None:
                exact[(metric, *key)] = floor
                groups.append(group)
        pooled = calibrate(groups)
        if pooled is not None:
            by_metric[metric] = pooled
    return NoiseFloors(exact, by_metric, source)


def level_value(metric: str, records: Sequence[RequestRecord], slo: Slo | None = None) -> float | None:
    """One run's figure for one level (its records): None when the run has none for it (goodput and
    attainment: none without `slo`)."""
    if metric in SLO_METRICS:
        kept = [r for r in records if r.error_kind not in CLIENT_SIDE]
        if slo is None or not kept:
            return None
        judged = judge_level(slo, kept)
        return judged.goodput_req_s if metric == "goodput" else judged.attainment
    if metric == "throughput":
        kept = [r for r in records if r.error_kind not in CLIENT_SIDE]
        return metrics.throughput_tok_s(kept) if any(r.ok for r in kept) else None
    values = _values(records, PER_REQUEST[metric])
    if not values:
        return None
    return quantile(values, 0.99 if metric.endswith("_p99") else 0.5)


def geometric_mean(values: Sequence[float]) -> float | None:
    if not values:
        return None
    if any(v <= 0 for v in values):
        return float(np.mean(values))
    return math.exp(sum(math.log(v) for v in values) / len(values))


def compare_metric(metric: str, base: Sequence[Sequence[RequestRecord]], cand: Sequence[Sequence[RequestRecord]], *,
                   target: str, level: int | float, alpha: float, paired: bool,
                   floor: Floor | None, slo: Slo | None = None) -> MetricComparison:
    """One metric of one level over the runs of each side (each run's records of that level); `slo`:
    the targets goodput and attainment are judged by."""
    base_values = [level_value(metric, rs, slo) for rs in base]
    cand_values = [level_value(metric, rs, slo) for rs in cand]
    common: dict[str, Any] = dict(metric=metric, target=target, concurrency=level, n_baseline=len(base),
                                  n_candidate=len(cand))
    have_b = [v for v in base_values if v is not None]
    have_c = [v for v in cand_values if v is not None]
    if len(have_b) < len(base_values) or len(have_c) < len(cand_values):
        return MetricComparison(**common, baseline=geometric_mean(have_b), candidate=geometric_mean(have_c),
                                note="a run has no value for it (no successful request with this figure)")
    effect: RunEffect = run_effect(have_b, have_c, alpha, paired=paired, floor=floor)  # every run has one
    note = None
    if effect.ratio is None:
        note = "a value of 0 has no ratio"
    elif effect.significant is None:
        note = "one run a side and no noise floor: run-to-run noise is unknown (more runs a side, or `loadgen calibrate`)"
    elif effect.detectable is None:
        note = (f"{len(base)}+{len(cand)} runs give one degree of freedom: what they detect is unknown "
                "(3 runs a side, or `loadgen calibrate`)")
    return MetricComparison(**common, baseline=geometric_mean(have_b), candidate=geometric_mean(have_c),
                            p_value=effect.p_value, ci_low=effect.ci_low, ci_high=effect.ci_high,
                            significant=effect.significant, note=note,
                            method=None if effect.significant is None else effect.method,
                            detectable=effect.detectable)


def compare_error_rate(base: Sequence[RequestRecord], cand: Sequence[RequestRecord], *, target: str,
                       concurrency: int | float, alpha: float) -> MetricComparison:
    """Failed / (ok + failed) over all the side's runs; Fisher's exact test on the pooled counts."""
    (base_failed, base_ok), (cand_failed, cand_ok) = _error_counts(base), _error_counts(cand)
    common: dict[str, Any] = dict(metric="error_rate", target=target, concurrency=concurrency,
                  baseline=_rate(base_failed, base_ok), candidate=_rate(cand_failed, cand_ok),
                  n_baseline=base_failed + base_ok, n_candidate=cand_failed + cand_ok)
    if not base_failed + base_ok or not cand_failed + cand_ok:
        return MetricComparison(**common, note="no finished requests")
    p_value = float(stats.fisher_exact([[base_failed, base_ok], [cand_failed, cand_ok]]).pvalue)
    return MetricComparison(**common, p_value=p_value, significant=p_value < alpha)


def _rate(failed: int, ok: int) -> float | None:
    return failed / (failed + ok) if failed + ok else None


def _error_counts(records: Sequence[RequestRecord]) -> tuple[int, int]:
    """(failed, ok), leaving out requests the user cancelled."""
    failed = sum(1 for r in records if not r.ok and r.error_kind not in CLIENT_SIDE)
    return failed, sum(1 for r in records if r.ok)


def compare_level(base: Sequence[Sequence[RequestRecord]], cand: Sequence[Sequence[RequestRecord]], *, target: str,
                  concurrency: int | float, alpha: float, paired: bool = False, floors: NoiseFloors | None = None,
                  only: Iterable[str] | None = None, slo: Slo | None = None) -> LevelComparison:
    """The metrics of one level (all, or those in `only`): `base` and `cand` hold, per run, that
    level's records; `slo`: the targets goodput and attainment are judged by."""
    chosen = None if only is None else set(only)
    compared = []
    for name in (n for n in (DEFAULT_COMPARED if chosen is None else METRICS) if chosen is None or n in chosen):
        if name == "error_rate":
            compared.append(compare_error_rate([r for rs in base for r in rs], [r for rs in cand for r in rs],
                                               target=target, concurrency=concurrency, alpha=alpha))
        else:
            floor = floors.lookup(name, target, concurrency) if floors else None
            compared.append(compare_metric(name, base, cand, target=target, level=concurrency, alpha=alpha,
                                           paired=paired, floor=floor, slo=slo))
    return LevelComparison(target, concurrency, tuple(compared))


def _values(records: Sequence[RequestRecord], per_record: Callable[[RequestRecord], float | None]) -> list[float]:
    out = []
    for r in records:
        if r.ok:
            v = per_record(r)
            if v is not None and math.isfinite(v):
                out.append(v)
    return out


# ---------------------------------------------------------------- two runs


def run_levels(doc: RunDocument | Mapping[str, Any], which: str) -> dict[str, list[int | float]]:
    """{label: [level, ...]} of the targets that have levels; CompareError if run.json is malformed."""
    return {t.label: [lv.level for lv in t.levels] for t in _typed(doc, which).targets if t.levels}


def _typed(doc: RunDocument | Mapping[str, Any], which: str) -> RunDocument:
    if isinstance(doc, RunDocument):
        return doc
    try:
        return RunDocument.of(dict(doc))
    except UserError:
        raise CompareError(f"the {which} run.json has a malformed target entry") from None


def cache_words(cache: CacheMode | None) -> str:
    """A run's cache mode in words: what a refusal names instead of run.json's object."""
    if cache is None:
        return "no cache mode"
    state = "" if cache.cache_prompt else ", cache_prompt off"
    name = {"shared_prefix": "shared prefix", "multi_turn": "multi-turn chat"}.get(cache.kind or "", cache.kind)
    return f"{name} ({cache.shape}{state})"


def check_comparable(baseline: RunDocument | Mapping[str, Any], candidate: RunDocument | Mapping[str, Any]) -> list[str]:
    """Refuse (CompareError) runs whose numbers cannot be compared; return warnings for the rest."""
    base, cand = _typed(baseline, "baseline"), _typed(candidate, "candidate")
    configs: list[Config] = []
    for which, doc in (("baseline", base), ("candidate", cand)):
        if not doc.kind.has_levels:
            raise CompareError(f"the {which} is a {doc.kind.value!r} run; compare reads runs with levels "
                               "(sweep, replay, capacity, ...)")
        if doc.config is None:
            raise CompareError(f"the {which} run.json has no config")
        configs.append(doc.config)
    if (base.kind is RunKind.DEMO) != (cand.kind is RunKind.DEMO):  # levels of any kind compare level by level
        raise CompareError(f"the runs are not comparable: the baseline is a {base.kind} run, the candidate "
                           f"a {cand.kind} run (demo figures are simulated)")
    base_config, cand_config = configs
    if base_config.cache_prompt != cand_config.cache_prompt:
        cached = "baseline" if base_config.cache_prompt else "candidate"
        raise CompareError(f"the runs are not comparable: the {cached} reused the server's prompt cache "
                           "(cache_prompt true) and the other did not; compare cached runs with cached runs")
    if msgspec.to_builtins(base_config.cache) != msgspec.to_builtins(cand_config.cache):
        raise CompareError(f"the runs are not comparable: their cache modes differ (baseline: "
                           f"{cache_words(base_config.cache_mode)}; candidate: {cache_words(cand_config.cache_mode)}); "
                           "rerun the candidate with the baseline's settings")
    for key in CONFIG_MUST_MATCH:
        # as stored: a typed value (a class) shown as run.json holds it
        base_value, cand_value = (msgspec.to_builtins(getattr(c, key)) for c in (base_config, cand_config))
        if base_value != cand_value:
            shown = ("differs" if key == "prompt"
                     else f"is {base_value!r} in the baseline, {cand_value!r} in the candidate")
            raise CompareError(f"the runs are not comparable: {key} {shown}; rerun the candidate with the "
                               "baseline's settings")
    warnings = []
    if base_config.temperature != cand_config.temperature:
        warnings.append(f"temperature differs ({base_config.temperature} vs {cand_config.temperature})")
    for which, doc in (("baseline", base), ("candidate", cand)):
        if not doc.complete:
            warnings.append(f"the {which} run is incomplete (stopped early); its last level may be short")
    base_levels, cand_levels = run_levels(base, "baseline"), run_levels(cand, "candidate")
    shared = sorted(base_levels.keys() & cand_levels.keys())
    if not shared:
        raise CompareError("the runs share no target label (baseline: "
                           f"{', '.join(sorted(base_levels)) or 'none'}; candidate: "
                           f"{', '.join(sorted(cand_levels)) or 'none'}); give both sweeps the same --label")
    if not any(set(base_levels[label]) & set(cand_levels[label]) for label in shared):
        raise CompareError("the runs share no level for "
                           + "; ".join(f"{label} (baseline {_levels_text(base_levels[label])}, "
                                       f"candidate {_levels_text(cand_levels[label])})" for label in shared))
    return warnings


def _levels_text(levels: Iterable[int | float]) -> str:
    return ",".join(f"{c:g}" for c in sorted(levels))


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """Which (target label, level) pairs two runs share, and what is left out and why."""

    pairs: tuple[tuple[str, int | float], ...]
    skipped: tuple[str, ...]


def plan_levels(baseline: RunDocument | Mapping[str, Any], baseline_records: Sequence[RequestRecord],
                candidate: RunDocument | Mapping[str, Any], candidate_records: Sequence[RequestRecord]) -> LevelPlan:
    """The levels both runs have records for; the others are reported as skipped."""
    base_levels, cand_levels = run_levels(baseline, "baseline"), run_levels(candidate, "candidate")
    rate_mode = _typed(baseline, "baseline").open_loop

    def where(level: int | float) -> str:
        return f"{level:g} req/s" if rate_mode else f"concurrency {level}"

    base_seen = {(r.target, r.level) for r in baseline_records}
    cand_seen = {(r.target, r.level) for r in candidate_records}
    pairs, skipped = [], []
    for label in sorted(base_levels.keys() - cand_levels.keys()):
        skipped.append(f"{label}: only in the baseline")
    for label in sorted(cand_levels.keys() - base_levels.keys()):
        skipped.append(f"{label}: only in the candidate")
    for label in sorted(base_levels.keys() & cand_levels.keys()):
        base_set, cand_set = set(base_levels[label]), set(cand_levels[label])
        for c in sorted(base_set | cand_set):
            if c not in cand_set:
                skipped.append(f"{label} at {where(c)}: only in the baseline")
            elif c not in base_set:
                skipped.append(f"{label} at {where(c)}: only in the candidate")
            elif (label, c) not in base_seen or (label, c) not in cand_seen:
                which = "baseline" if (label, c) not in base_seen else "candidate"
                skipped.append(f"{label} at {where(c)}: the {which} has no request records for it")
            else:
                pairs.append((label, c))
    return LevelPlan(tuple(pairs), tuple(skipped))


def plan_sides(baseline: Sequence[RunData], candidate: Sequence[RunData]) -> tuple[LevelPlan, list[str]]:
    """The levels every run of both sides has records for, and the warnings of checking each
    candidate and each further baseline run against the first baseline run."""
    if not baseline or not candidate:
        raise CompareError("a side has no run to compare")
    first = baseline[0]
    warnings: list[str] = []
    for run in [*baseline[1:], *candidate]:
        warnings += [w for w in check_comparable(first.typed, run.typed) if w not in warnings]
    plans = [plan_levels(b.typed, b.records, c.typed, c.records) for b in baseline for c in candidate]
    pairs = [p for p in plans[0].pairs if all(p in plan.pairs for plan in plans[1:])]
    skipped = list(dict.fromkeys(s for plan in plans for s in plan.skipped))
    for label, level in plans[0].pairs:
        if (label, level) not in pairs:
            skipped.append(f"{label} at {level:g}: not in every run")
    return LevelPlan(tuple(pairs), tuple(skipped)), warnings


def compare_sides(baseline: Sequence[RunData], candidate: Sequence[RunData], *, confidence: float = 0.95,
                  floors: NoiseFloors | None = None, only: Iterable[str] | None = None,
                  error_rate_tested: bool = True) -> RunComparison:
    """Compare every (target label, level) that all runs of both sides share, each check at the
    Bonferroni-corrected confidence. Raises CompareError when the runs are not comparable.
    `error_rate_tested` False: the error rate is a ceiling (the gate's), not one of the k tests."""
    if not 0.5 <= confidence < 1.0:
        raise CompareError(f"confidence must be in [0.5, 1), got {confidence}")
    baseline = sorted(baseline, key=lambda r: r.started)
    candidate = sorted(candidate, key=lambda r: r.started)
    plan, warnings = plan_sides(baseline, candidate)
    if not plan.pairs:
        raise CompareError("no level has request records in both runs: " + "; ".join(plan.skipped))
    chosen = [n for n in (DEFAULT_COMPARED if only is None else METRICS) if only is None or n in set(only)]
    tested = [n for n in chosen if error_rate_tested or n != "error_rate"]
    slo = shared_slo(baseline, candidate) if any(n in SLO_METRICS for n in chosen) else None
    per_check = 1.0 - (1.0 - confidence) / max(1, len(plan.pairs) * len(tested))
    paired = interleaved([_start_s(r) for r in baseline], [_start_s(r) for r in candidate])
    base_levels = [_by_level(r.records) for r in baseline]
    cand_levels = [_by_level(r.records) for r in candidate]
    compared = tuple(compare_level([b[pair] for b in base_levels], [c[pair] for c in cand_levels], target=pair[0],
                                   concurrency=pair[1], alpha=1.0 - per_check, paired=paired, floors=floors,
                                   only=chosen, slo=slo) for pair in plan.pairs)
    return RunComparison(confidence, compared, plan.skipped, tuple(warnings), per_check,
                         (len(baseline), len(candidate)), paired, floors.source if floors else None)


def shared_slo(baseline: Sequence[RunData], candidate: Sequence[RunData]) -> Slo:
    """The --slo every run was made with, that goodput and attainment are judged by; CompareError
    when a run has none or two runs differ (their goodputs would answer different questions)."""
    seen: dict[Slo, str] = {}
    for which, runs in (("baseline", baseline), ("candidate", candidate)):
        for run in runs:
            targets = run.typed.config.slo_targets if run.typed.config is not None else None
            if targets is None or not targets.targets_ms:
                raise CompareError(f"goodput and attainment are judged against the runs' --slo, and a {which} run "
                                   "has none: run it with --slo")
            seen.setdefault(Slo(tuple(targets.targets_ms.items()), targets.attainment), which)
    if len(seen) > 1:
        raise CompareError("the runs were judged against different --slo (" + "; ".join(
            f"{which}: {slo.text()} at {slo.attainment:.0%}" for slo, which in seen.items())
            + "): goodput and attainment compare runs made with the same targets")
    return next(iter(seen))


def _start_s(run: RunData) -> float:
    """The run's start, in seconds (ISO-8601 UTC text in run.json); 0 when it is missing."""
    try:
        return _dt.datetime.fromisoformat(run.started).timestamp()
    except ValueError:
        return 0.0


def _by_level(records: Iterable[RequestRecord]) -> dict[tuple[str, int | float], list[RequestRecord]]:
    out: dict[tuple[str, int | float], list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[(r.target, r.level)].append(r)
    return out
