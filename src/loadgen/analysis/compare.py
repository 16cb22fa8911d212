"""Is the candidate run different from the baseline? Pure statistics over two runs: no I/O.

A run is its run.json document plus its request records (see results/reader.py). Every figure is
recomputed from the records with the definitions in `metrics.py`; requests cancelled by the user
are left out. For each target label and concurrency level present in both runs:

- throughput      output tokens per second of the level. The level's wall span (first send -> last
                  completion) is cut into equal windows (5, else 4) that each hold >= 1 successful
                  completion; each window gives tokens completed in it / window length. The mean of
                  the windows is exactly the level's `metrics.throughput_tok_s`. Significance: a
                  bootstrap interval of the ratio of means (candidate / baseline) that excludes 1.
- latency_p50, queue_wait_p50, decode_tok_s (median per request): significant when a two-sided
                  Mann-Whitney U test gives p < 1 - confidence AND the bootstrap interval of the
                  ratio of medians excludes 1 (the test says the distributions differ, the interval
                  says the median moved, and in which direction).
- latency_p99     significant when the bootstrap interval of the ratio of p99s excludes 1. A rank
                  test says nothing about a tail, so it is not consulted. Tested only from
                  `MIN_P99_REQUESTS` requests per side: below that p99 is (nearly) the maximum.
- error_rate      failed / (ok + failed); significance from Fisher's exact test on the 2x2 counts.

Percentiles are the value of rank round(q * n), HdrHistogram's definition, so p50 and p99 agree
with run.json and `report`. Bootstrap intervals are percentile intervals from a generator seeded
per (metric, target, level): the same two runs always give the same answer. A metric that cannot
be tested (too few requests or windows) has `significant = None`, which callers must not read as
"no change".
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from ..core.errors import UserError
from ..core.records import CANCELLED, RequestRecord
from ..core.rundoc import is_open_loop
from . import metrics

THROUGHPUT_WINDOWS = (5, 4)  # tried in order; each window needs at least one successful completion
MIN_REQUESTS = 5  # per side, for a per-request metric to be tested at all
# Per side, for p99. Below it p99 is the largest or second-largest value, and a bootstrap of an
# extreme order statistic calls noise a change several times more often than 1 - confidence.
MIN_P99_REQUESTS = 100
RESAMPLES = 2000
_MAX_RESAMPLE_CELLS = 2_000_000  # bound the memory of one vectorised bootstrap chunk
CONFIG_MUST_MATCH = ("api", "mode", "stream", "prompt", "n_predict", "ignore_eos")
SWEEP_KINDS = ("sweep", "demo")  # `loadgen demo` writes a sweep of simulated servers


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
)}


# the per-request figure behind each per-request metric (successful requests only)
PER_REQUEST: dict[str, Callable[[RequestRecord], float | None]] = {
    "latency_p50": metrics.latency_ms,
    "latency_p99": metrics.latency_ms,
    "queue_wait_p50": metrics.queue_wait_ms,
    "decode_tok_s": metrics.decode_tok_s,
}


@dataclass(frozen=True, slots=True)
class MetricComparison:
    """One metric of one level: both values, and whether the difference is more than noise."""

    metric: str
    target: str
    concurrency: int
    baseline: float | None
    candidate: float | None
    n_baseline: int  # sample size: requests, or throughput windows
    n_candidate: int
    p_value: float | None = None  # Mann-Whitney U (per-request medians) or Fisher (error rate)
    ci_low: float | None = None  # bootstrap interval of candidate / baseline
    ci_high: float | None = None
    significant: bool | None = None  # None: too little data to test
    note: str | None = None

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
            "significant": self.significant, "note": self.note,
        }


@dataclass(frozen=True, slots=True)
class LevelComparison:
    target: str
    concurrency: int
    metrics: tuple[MetricComparison, ...]

    def get(self, metric: str) -> MetricComparison:
        return next(m for m in self.metrics if m.metric == metric)


@dataclass(frozen=True, slots=True)
class RunComparison:
    confidence: float
    levels: tuple[LevelComparison, ...]
    skipped: tuple[str, ...] = ()  # "<label> at concurrency 8: only in the candidate"
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "confidence": self.confidence,
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


def mann_whitney_p(baseline: Sequence[float], candidate: Sequence[float]) -> float:
    """Two-sided Mann-Whitney U p-value; 1.0 when the samples cannot be told apart at all (all ties)."""
    p = float(stats.mannwhitneyu(baseline, candidate, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p


def bootstrap_ratio_ci(baseline: Sequence[float], candidate: Sequence[float], q: float | None,
                       confidence: float, rng: np.random.Generator,
                       resamples: int = RESAMPLES) -> tuple[float, float] | None:
    """Percentile bootstrap interval of stat(candidate) / stat(baseline): the q-quantile, or the mean if q is None.

    Each side is resampled on its own (the runs are independent). None when the baseline's
    statistic is 0 in so many resamples that a ratio means nothing.
    """
    base = _bootstrap(baseline, q, rng, resamples)
    cand = _bootstrap(candidate, q, rng, resamples)
    usable = base > 0
    if usable.mean() < confidence:
        return None
    ratios = cand[usable] / base[usable]
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def _bootstrap(values: Sequence[float], q: float | None, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """The statistic of `resamples` resamples with replacement, computed in memory-bounded chunks."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    rows_per_chunk = max(1, _MAX_RESAMPLE_CELLS // n)
    out = []
    for start in range(0, resamples, rows_per_chunk):
        picks = rng.integers(0, n, size=(min(rows_per_chunk, resamples - start), n))
        if q is None:
            out.append(ordered[picks].mean(axis=1))
        else:
            # indices into sorted values sort like the values: the k-th smallest index is the quantile
            k = rank_index(n, q)
            out.append(ordered[np.partition(picks, k, axis=1)[:, k]])
    return np.concatenate(out)


def _excludes_one(ci: tuple[float, float] | None) -> bool | None:
    if ci is None:
        return None
    return ci[0] > 1.0 or ci[1] < 1.0


def throughput_windows(records: Sequence[RequestRecord],
                       window_counts: Iterable[int] = THROUGHPUT_WINDOWS) -> list[float] | None:
    """Tokens per second in equal windows of the level's wall span, by completion time.

    The span and the tokens are those of `metrics.level_wall_s` and `metrics.output_tokens`, so
    the mean of the windows is the level's throughput. Returns the first split in `window_counts`
    whose every window holds at least one successful completion, or None if none does.
    """
    rs = [r for r in records if r.error_kind != CANCELLED]
    wall_s = metrics.level_wall_s(rs)
    if wall_s <= 0:
        return None
    start_ns = min(r.send_ns for r in rs)
    span_ns = wall_s * 1e9
    for count in window_counts:
        tokens = [0] * count
        completions = [0] * count
        for r in rs:
            if r.ok:
                i = min(int((r.complete_ns - start_ns) / span_ns * count), count - 1)
                tokens[i] += metrics.output_tokens([r])
                completions[i] += 1
        if all(completions):
            return [t / (wall_s / count) for t in tokens]
    return None


# ---------------------------------------------------------------- one metric of one level


def _rng(seed: int, *key: object) -> np.random.Generator:
    """A generator per (metric, target, level): results do not depend on the order of comparison."""
    return np.random.default_rng([seed, zlib.crc32(repr(key).encode())])


def compare_throughput(base: Sequence[RequestRecord], cand: Sequence[RequestRecord], *, target: str,
                       concurrency: int, confidence: float, seed: int = 0) -> MetricComparison:
    base_windows, cand_windows = throughput_windows(base), throughput_windows(cand)
    kept_base = [r for r in base if r.error_kind != CANCELLED]
    kept_cand = [r for r in cand if r.error_kind != CANCELLED]
    common = dict(metric="throughput", target=target, concurrency=concurrency,
                  baseline=metrics.throughput_tok_s(kept_base) if kept_base else None,
                  candidate=metrics.throughput_tok_s(kept_cand) if kept_cand else None,
                  n_baseline=len(base_windows or ()), n_candidate=len(cand_windows or ()))
    if base_windows is None or cand_windows is None:
        return MetricComparison(**common, note=f"too few completions for {min(THROUGHPUT_WINDOWS)} "
                                               "throughput windows")
    ci = bootstrap_ratio_ci(base_windows, cand_windows, None, confidence,
                            _rng(seed, "throughput", target, concurrency))
    return MetricComparison(**common, ci_low=ci and ci[0], ci_high=ci and ci[1], significant=_excludes_one(ci),
                            note=None if ci else "baseline throughput is 0")


def compare_per_request(metric: str, base_values: Sequence[float], cand_values: Sequence[float], *,
                        target: str, concurrency: int, confidence: float, seed: int = 0) -> MetricComparison:
    """A median (latency_p50, queue_wait_p50, decode_tok_s) or latency_p99 of per-request values."""
    q = 0.99 if metric == "latency_p99" else 0.5
    base, cand = list(base_values), list(cand_values)
    common = dict(metric=metric, target=target, concurrency=concurrency,
                  baseline=quantile(base, q) if base else None,
                  candidate=quantile(cand, q) if cand else None,
                  n_baseline=len(base), n_candidate=len(cand))
    if min(len(base), len(cand)) < MIN_REQUESTS:
        return MetricComparison(**common, note=f"fewer than {MIN_REQUESTS} requests with this figure")
    if metric == "latency_p99" and min(len(base), len(cand)) < MIN_P99_REQUESTS:
        return MetricComparison(**common, note=f"p99 is tested from {MIN_P99_REQUESTS} requests per level "
                                               f"(have {len(base)} and {len(cand)})")
    ci = bootstrap_ratio_ci(base, cand, q, confidence, _rng(seed, metric, target, concurrency))
    note = None if ci else "baseline value is 0, no ratio"
    if metric == "latency_p99":
        significant, p_value = _excludes_one(ci), None
    else:
        p_value = mann_whitney_p(base, cand)
        excludes = _excludes_one(ci)
        significant = None if excludes is None else (p_value < 1.0 - confidence and excludes)
    return MetricComparison(**common, p_value=p_value, ci_low=ci and ci[0], ci_high=ci and ci[1],
                            significant=significant, note=note)


def compare_error_rate(base: Sequence[RequestRecord], cand: Sequence[RequestRecord], *, target: str,
                       concurrency: int, confidence: float) -> MetricComparison:
    (base_failed, base_ok), (cand_failed, cand_ok) = _error_counts(base), _error_counts(cand)
    common = dict(metric="error_rate", target=target, concurrency=concurrency,
                  baseline=_rate(base_failed, base_ok), candidate=_rate(cand_failed, cand_ok),
                  n_baseline=base_failed + base_ok, n_candidate=cand_failed + cand_ok)
    if not common["n_baseline"] or not common["n_candidate"]:
        return MetricComparison(**common, note="no finished requests")
    p_value = float(stats.fisher_exact([[base_failed, base_ok], [cand_failed, cand_ok]]).pvalue)
    return MetricComparison(**common, p_value=p_value, significant=p_value < 1.0 - confidence)


def _rate(failed: int, ok: int) -> float | None:
    return failed / (failed + ok) if failed + ok else None


def _error_counts(records: Sequence[RequestRecord]) -> tuple[int, int]:
    """(failed, ok), leaving out requests the user cancelled."""
    failed = sum(1 for r in records if not r.ok and r.error_kind != CANCELLED)
    return failed, sum(1 for r in records if r.ok)


def compare_level(base: Sequence[RequestRecord], cand: Sequence[RequestRecord], *, target: str,
                  concurrency: int, confidence: float, seed: int = 0,
                  only: Iterable[str] | None = None) -> LevelComparison:
    """The metrics of one level (all, or those in `only`); `base` and `cand` are that level's records."""
    chosen = None if only is None else set(only)
    wanted = [name for name in METRICS if chosen is None or name in chosen]
    where = dict(target=target, concurrency=concurrency, confidence=confidence)
    compared = []
    for name in wanted:
        if name == "throughput":
            compared.append(compare_throughput(base, cand, seed=seed, **where))
        elif name == "error_rate":
            compared.append(compare_error_rate(base, cand, **where))
        else:
            per_record = PER_REQUEST[name]
            compared.append(compare_per_request(name, _values(base, per_record), _values(cand, per_record),
                                                seed=seed, **where))
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


def run_levels(doc: Mapping[str, Any], which: str) -> dict[str, list[int]]:
    """{label: [concurrency, ...]} of the targets that have levels; CompareError if run.json is malformed."""
    out: dict[str, list[int]] = {}
    for t in doc["targets"]:
        try:
            label = t["label"]
            levels = [lv["level"] for lv in t.get("levels") or []]
        except (TypeError, KeyError, AttributeError):
            raise CompareError(f"the {which} run.json has a malformed target entry") from None
        if not isinstance(label, str) or not all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                                 for c in levels):
            raise CompareError(f"the {which} run.json has a malformed target entry")
        if levels:
            out[label] = levels
    return out


def check_comparable(baseline: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    """Refuse (CompareError) runs whose numbers cannot be compared; return warnings for the rest."""
    for which, doc in (("baseline", baseline), ("candidate", candidate)):
        if doc.get("kind") not in SWEEP_KINDS:
            raise CompareError(f"the {which} is a {doc.get('kind')!r} run; compare reads runs of `loadgen sweep`")
        if not isinstance(doc.get("config"), dict):
            raise CompareError(f"the {which} run.json has no config")
    if baseline["kind"] != candidate["kind"]:
        raise CompareError(f"the runs are not comparable: the baseline is a {baseline['kind']} run, the candidate "
                           f"a {candidate['kind']} run (demo figures are simulated)")
    base_config, cand_config = baseline["config"], candidate["config"]
    for key in CONFIG_MUST_MATCH:
        if base_config.get(key) != cand_config.get(key):
            shown = ("differs" if key == "prompt"
                     else f"is {base_config.get(key)!r} in the baseline, {cand_config.get(key)!r} in the candidate")
            raise CompareError(f"the runs are not comparable: {key} {shown}; rerun the candidate with the "
                               "baseline's settings")
    warnings = []
    if base_config.get("temperature") != cand_config.get("temperature"):
        warnings.append(f"temperature differs ({base_config.get('temperature')} vs {cand_config.get('temperature')})")
    for which, doc in (("baseline", baseline), ("candidate", candidate)):
        if not doc.get("complete", False):
            warnings.append(f"the {which} run is incomplete (stopped early); its last level may be short")
    base_levels, cand_levels = run_levels(baseline, "baseline"), run_levels(candidate, "candidate")
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


def _levels_text(levels: Iterable[int]) -> str:
    return ",".join(f"{c:g}" for c in sorted(levels))


@dataclass(frozen=True, slots=True)
class LevelPlan:
    """Which (target label, level) pairs two runs share, and what is left out and why."""

    pairs: tuple[tuple[str, int], ...]
    skipped: tuple[str, ...]


def plan_levels(baseline: Mapping[str, Any], baseline_records: Sequence[RequestRecord],
                candidate: Mapping[str, Any], candidate_records: Sequence[RequestRecord]) -> LevelPlan:
    """The levels both runs have records for; the others are reported as skipped."""
    base_levels, cand_levels = run_levels(baseline, "baseline"), run_levels(candidate, "candidate")
    rate_mode = is_open_loop(baseline)

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


def compare_runs(baseline: Mapping[str, Any], baseline_records: Sequence[RequestRecord],
                 candidate: Mapping[str, Any], candidate_records: Sequence[RequestRecord], *,
                 confidence: float = 0.95, seed: int = 0, only: Iterable[str] | None = None) -> RunComparison:
    """Compare every (target label, level) present in both runs. Raises CompareError when they are not comparable."""
    if not 0.5 <= confidence < 1.0:
        raise CompareError(f"confidence must be in [0.5, 1), got {confidence}")
    warnings = check_comparable(baseline, candidate)
    plan = plan_levels(baseline, baseline_records, candidate, candidate_records)
    if not plan.pairs:
        raise CompareError("no level has request records in both runs: " + "; ".join(plan.skipped))
    base_by_level, cand_by_level = _by_level(baseline_records), _by_level(candidate_records)
    compared = tuple(compare_level(base_by_level[pair], cand_by_level[pair], target=pair[0], concurrency=pair[1],
                                   confidence=confidence, seed=seed, only=only) for pair in plan.pairs)
    return RunComparison(confidence, compared, plan.skipped, tuple(warnings))


def _by_level(records: Iterable[RequestRecord]) -> dict[tuple[str, int], list[RequestRecord]]:
    out: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[(r.target, r.level)].append(r)
    return out
