"""Is a difference between two sides more than the machine's run-to-run noise? Pure statistics.

The unit is the run. Each run of a side gives one value of a figure (a level's throughput, its
latency p50, ...); the requests inside a run only describe that run's spread. Two sweeps of the
same server on a shared machine differ by 10-35% when the machine's speed drifts, and a test that
treats requests as independent samples calls that drift "highly significant". So:

Model. log(value of run i) = mu_side + e_i, where e_i is the run-to-run noise, normal with
standard deviation sigma (the machine's drift, warm-up, scheduling: a relative spread, since
logs turn ratios into differences). The effect is the ratio of the sides' geometric means,
r = exp(mean log candidate - mean log baseline).

How sigma is known, best first:
- *paired*: both sides have the same number of runs, recorded in pairs (A B, B A, A B ...). Pair i's
  difference d_i = log B_i - log A_i cancels the drift the two runs shared; var d = 2 sigma^2.
- *unpaired*: two or more runs on a side; sigma^2 pooled from both sides' variances of logs.
- a *noise floor*: sigma measured beforehand by repeating one configuration (an A/A calibration,
  `Floor`, from neighbouring runs: it holds for runs recorded close together, not for a baseline
  saved last week), with its degrees of freedom. It is pooled with what the runs show (the standard
  pooled variance), so a single run per side can still be tested, and three runs get a
  trustworthy sigma instead of one from two degrees of freedom.
- none: one run per side and no floor. Nothing tells noise from change: the result has no test
  (`significant` None), which callers report as inconclusive, never as a regression.

Test. t = log r / se with se = sigma sqrt(1/n_b + 1/n_c) (paired: sigma sqrt(2/n)); two-sided p
from Student's t with the pooled degrees of freedom; the interval of r is
exp(log r +- t_(1-alpha/2) se). `detectable` is the smallest relative change the runs detect
with 80% power at that alpha: exp((t_(1-alpha/2) + t_0.80) se) - 1. A limit below it cannot be
enforced with these runs. It needs sigma from at least MIN_POWER_DF degrees of freedom: from one
(two pairs, or 2 runs against 1) sigma is one difference of two differences, which two runs can
make as small as they please by chance (two pairs 1.1 tok/s apart each gave sigma 0.004%), so
`detectable` is None there, and the check's power is unknown, not good.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

POWER = 0.80
MIN_POWER_DF = 2  # degrees of freedom below which sigma says nothing of what the runs detect
PAIRED, UNPAIRED, FLOOR_ONLY, UNTESTED = "paired", "unpaired", "noise floor", "untested"


@dataclass(frozen=True, slots=True)
class Floor:
    """A measured run-to-run noise: the standard deviation of log(value) between runs of one
    configuration, and the degrees of freedom it was estimated with (runs - 1, summed over groups)."""

    sigma: float
    df: int


@dataclass(frozen=True, slots=True)
class RunEffect:
    ratio: float | None  # geometric mean candidate / baseline
    n_baseline: int  # runs
    n_candidate: int
    method: str  # PAIRED, UNPAIRED, FLOOR_ONLY or UNTESTED
    sigma: float | None = None  # the run-to-run noise used (log scale)
    df: int = 0
    p_value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    detectable: float | None = None  # smallest relative change detectable with 80% power; None below MIN_POWER_DF

    @property
    def significant(self) -> bool | None:
        """The interval excludes 1; None when there is no test."""
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low > 1.0 or self.ci_high < 1.0


def log_values(values: Sequence[float]) -> list[float] | None:
    """Logs of the values; None when any is not a positive finite number (no ratio exists)."""
    if len(values) == 0 or any(not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0) for v in values):
        return None
    return [math.log(v) for v in values]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _ss(xs: Sequence[float]) -> float:
    """Sum of squared deviations from the mean."""
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs)


def observed_noise(baseline: Sequence[float], candidate: Sequence[float],
                   paired: bool) -> tuple[float, int]:
    """(sum of squares, degrees of freedom) of the run-to-run noise the two sides show, in per-run
    units of log value. Paired: from the pair differences (var d = 2 sigma^2)."""
    if paired:
        diffs = [c - b for b, c in zip(baseline, candidate)]
        return _ss(diffs) / 2, len(diffs) - 1
    return _ss(baseline) + _ss(candidate), len(baseline) - 1 + len(candidate) - 1


def run_effect(baseline: Sequence[float], candidate: Sequence[float], alpha: float, *,
               paired: bool = False, floor: Floor | None = None) -> RunEffect:
    """The effect of candidate vs baseline runs (one value per run) and its test at level alpha."""
    logs_b, logs_c = log_values(baseline), log_values(candidate)
    n_b, n_c = len(baseline), len(candidate)
    if logs_b is None or logs_c is None:
        return RunEffect(None, n_b, n_c, UNTESTED)
    log_ratio = _mean(logs_c) - _mean(logs_b)
    ratio = math.exp(log_ratio)
    paired = paired and n_b == n_c and n_b >= 2
    ss, df = observed_noise(logs_b, logs_c, paired)
    method = PAIRED if paired else UNPAIRED if df > 0 else FLOOR_ONLY
    if floor is not None and floor.df > 0:
        ss, df = ss + floor.sigma ** 2 * floor.df, df + floor.df
    if df <= 0:
        return RunEffect(ratio, n_b, n_c, UNTESTED)
    sigma = math.sqrt(ss / df)
    se = sigma * math.sqrt(2 / n_b if paired else 1 / n_b + 1 / n_c)
    t_crit = float(stats.t.ppf(1 - alpha / 2, df))
    detectable = math.expm1((t_crit + float(stats.t.ppf(POWER, df))) * se) if df >= MIN_POWER_DF else None
    if se == 0:
        p = 1.0 if log_ratio == 0 else 0.0
        return RunEffect(ratio, n_b, n_c, method, 0.0, df, p, ratio, ratio, detectable)
    p = float(2 * stats.t.sf(abs(log_ratio) / se, df))
    return RunEffect(ratio, n_b, n_c, method, sigma, df, p, math.exp(log_ratio - t_crit * se),
                     math.exp(log_ratio + t_crit * se), detectable)


def calibrate(groups: Sequence[Sequence[float]]) -> Floor | None:
    """The noise floor from A/A runs: per group (one per target and level), the values of runs of
    one unchanged configuration in the order they ran. Successive differences (von Neumann): each
    run is compared with the one just before it, sigma^2 = sum(d^2) / (2 m) over the m differences,
    so slow drift across a long calibration is not counted, as it is not in a comparison of
    neighbouring (interleaved or back-to-back) runs; nor is a difference between groups."""
    ss, df = 0.0, 0
    for group in groups:
        logs = log_values(group)
        if logs is None or len(logs) < 2:
            continue
        diffs = [b - a for a, b in zip(logs, logs[1:])]
        ss, df = ss + sum(d * d for d in diffs) / 2, df + len(diffs)
    return Floor(math.sqrt(ss / df), df) if df else None


def interleaved(baseline_starts: Sequence[float], candidate_starts: Sequence[float]) -> bool:
    """The runs were recorded in pairs, one of each side per pair, pair after pair (A B A B ...,
    or counterbalanced A B B A ...): the start times sorted together fall into consecutive twos that
    each hold one run of each side."""
    if len(baseline_starts) != len(candidate_starts) or len(baseline_starts) < 2:
        return False
    sides = [side for _, side in sorted([(t, 0) for t in baseline_starts] + [(t, 1) for t in candidate_starts])]
    return all(sides[i] != sides[i + 1] for i in range(0, len(sides), 2))
