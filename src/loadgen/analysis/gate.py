"""The regression gate: which checks to run, their limits, and the verdict over a comparison of two sides.

A check fails only when the candidate is worse than the baseline by more than its limit AND the
difference is more than run-to-run noise (analysis/compare.py: the run is the unit; see
analysis/between_runs.py). "Significant but within the limit" passes. "Beyond the limit but not
significant", or no test at all (one run a side and no noise floor), is *inconclusive*: a
warning, or a failure with `strict`; never a regression. The gate also says the smallest change
its runs can detect per metric and warns when a limit is tighter than that. The error rate is
the exception: an absolute ceiling on the candidate's failed / (ok + failed), with no test.

No verdict without the evidence for it: a check is *enforced* only when its runs could catch a
breach of its limit (the error-rate ceiling whenever the candidate finished requests; a limit on
throughput or latency when it was tested and the smallest change its runs detect is within the
limit). A gate none of whose statistical checks is enforced neither passes nor fails: it is *not
enforced* (its own exit code); a gate that passes with some checks not enforced says how many.

`confidence` is that of the whole gate. With k statistical checks (metrics x levels, error rate
excluded), each is tested at 1 - (1 - confidence) / k (Bonferroni), so the chance that noise fails
the gate somewhere stays below 1 - confidence however many levels a sweep has.

Limits come from defaults, then the `[gate]` table of a TOML file, then the command line.
Everything here is pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import EXIT_FAILED, EXIT_NOT_ENFORCED, EXIT_OK, UserError
from .compare import METRICS, MetricComparison, NoiseFloors, RunComparison, RunData, compare_sides

DEFAULT_METRICS = ("throughput", "latency_p50", "latency_p99", "error_rate")
DEFAULT_LIMITS = {  # worse by more than this share fails
    "throughput": 0.05,
    "decode_tok_s": 0.05,
    "latency_p50": 0.05,
    "latency_p99": 0.10,
    "queue_wait_p50": 0.10,
    "queue_wait_p99": 0.10,
    "ttft_p50": 0.05,
    "ttft_p99": 0.10,
    "tpot_p50": 0.05,
    "tpot_p99": 0.10,
    "goodput": 0.05,  # requests a second within --slo (asked by name)
    "attainment": 0.05,  # their share, relative: 95% -> 90% is a drop of 5.3%
}
DEFAULT_MAX_ERROR_RATE = 0.0
DEFAULT_CONFIDENCE = 0.95

# keys of --max-throughput-drop and --max-latency-rise ("p99:10%,p50:5%"); a bare "10%" sets them all
DROP_KEYS = {"throughput": "throughput", "decode": "decode_tok_s", "decode_tok_s": "decode_tok_s",
             "goodput": "goodput", "attainment": "attainment"}
RISE_KEYS = {"p50": "latency_p50", "p99": "latency_p99", "queue_wait": "queue_wait_p50",
             "latency_p50": "latency_p50", "latency_p99": "latency_p99", "queue_wait_p50": "queue_wait_p50",
             **{name: name for name in ("queue_wait_p99", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")}}
METRIC_ALIASES = {"queue_wait": "queue_wait_p50", "p50": "latency_p50", "p99": "latency_p99", "decode": "decode_tok_s"}
FILE_KEYS = ("max_throughput_drop", "max_latency_rise", "max_error_rate", "confidence", "metrics", "strict")

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


class GateConfigError(UserError, ValueError):
    """A bad limit, flag or gate file; the message is one line: `where: what is wrong`."""


@dataclass(frozen=True, slots=True)
class GateConfig:
    limits: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    confidence: float = DEFAULT_CONFIDENCE
    metrics: tuple[str, ...] = DEFAULT_METRICS
    strict: bool = False



# ---------------------------------------------------------------- parsing limits


def parse_share(value: Any, where: str) -> float:
    """"5%" -> 0.05, 0.05 -> 0.05. A bare number above 1 is refused: write 150% for 1.5."""
    if isinstance(value, bool):
        raise GateConfigError(f"{where}: expected a share like 5% or 0.05, got {value!r}")
    if isinstance(value, (int, float)):
        number, percent = float(value), False
    elif isinstance(value, str):
        text = value.strip()
        percent = text.endswith("%")
        try:
            number = float(text.rstrip("%").strip())
        except ValueError:
            raise GateConfigError(f"{where}: expected a share like 5% or 0.05, got {value!r}") from None
    else:
        raise GateConfigError(f"{where}: expected a share like 5% or 0.05, got {value!r}")
    if not math.isfinite(number) or number < 0:
        raise GateConfigError(f"{where}: must be a share >= 0, got {value!r}")
    if not percent and number > 1:
        raise GateConfigError(f"{where}: {value!r} is ambiguous; write {number:g}% or {number / 100:g}")
    return number / 100 if percent else number


def parse_limits(value: Any, where: str, keys: Mapping[str, str]) -> dict[str, float]:
    """A bare share for every metric of `keys`, or "key:share,...", or (from TOML) a {key: share} table."""
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, str) and ":" in value:
        items = []
        for part in value.split(","):
            key, sep, share = part.partition(":")
            if not sep or not key.strip():
                raise GateConfigError(f"{where}: expected key:share pairs like p99:10%,p50:5%, got {value!r}")
            items.append((key.strip(), share))
    else:
        one = parse_share(value, where)
        return {metric: one for metric in dict.fromkeys(keys.values())}
    out = {}
    for key, share in items:
        if key not in keys:
            raise GateConfigError(f"{where}: unknown key {key!r} (use {', '.join(_short_keys(keys))})")
        out[keys[key]] = parse_share(share, f"{where}: {key}")
    return out


def _short_keys(keys: Mapping[str, str]) -> list[str]:
    seen, out = set(), []
    for key, metric in keys.items():
        if metric not in seen:
            seen.add(metric)
            out.append(key)
    return out


def parse_metrics(value: Any, where: str) -> tuple[str, ...]:
    """Metric names from a comma-separated string or a list of them; aliases p50, p99, queue_wait, decode."""
    if isinstance(value, str):
        names = [value]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        names = list(value)
    else:
        raise GateConfigError(f"{where}: expected metric names, got {value!r}")
    out = []
    for part in (p.strip() for name in names for p in name.split(",")):
        metric = METRIC_ALIASES.get(part, part)
        if metric not in METRICS:
            raise GateConfigError(f"{where}: unknown metric {part!r} (use {', '.join(METRICS)})")
        if metric not in out:
            out.append(metric)
    if not out:
        raise GateConfigError(f"{where}: no metric named")
    return tuple(out)


def parse_confidence(value: Any, where: str) -> float:
    """0.95 or "95%"; at least 0.5 and below 1."""
    problem = f"{where}: must be at least 0.5 and below 1, like 0.95 or 95%, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1:
        raise GateConfigError(problem)
    try:
        confidence = parse_share(value, where)
    except GateConfigError:
        raise GateConfigError(problem) from None
    if not 0.5 <= confidence < 1:
        raise GateConfigError(problem)
    return confidence


def parse_settings(values: Mapping[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
    """Raw settings (flags, or a [gate] table) -> parsed ones. `where(key)` starts each error message."""
    parsers: dict[str, Callable[[Any, str], Any]] = {
        "max_throughput_drop": lambda v, w: parse_limits(v, w, DROP_KEYS),
        "max_latency_rise": lambda v, w: parse_limits(v, w, RISE_KEYS),
        "max_error_rate": parse_share,
        "confidence": parse_confidence,
        "metrics": parse_metrics,
        "strict": _parse_bool,
    }
    out = {}
    for key, value in values.items():
        if key not in parsers:
            raise GateConfigError(f"{where(key)}: unknown key (known: {', '.join(FILE_KEYS)})")
        if value is not None:
            out[key] = parsers[key](value, where(key))
    return out


def _parse_bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise GateConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def build_config(*layers: Mapping[str, Any]) -> GateConfig:
    """Defaults, then each layer of parsed settings in turn (file, then flags); limits merge per metric."""
    limits = dict(DEFAULT_LIMITS)
    merged: dict[str, Any] = {}
    for layer in layers:
        limits.update(layer.get("max_throughput_drop", {}))
        limits.update(layer.get("max_latency_rise", {}))
        merged.update({k: v for k, v in layer.items() if k not in ("max_throughput_drop", "max_latency_rise")})
    return GateConfig(limits=limits, max_error_rate=merged.get("max_error_rate", DEFAULT_MAX_ERROR_RATE),
                      confidence=merged.get("confidence", DEFAULT_CONFIDENCE),
                      metrics=merged.get("metrics", DEFAULT_METRICS), strict=merged.get("strict", False))


# ---------------------------------------------------------------- the verdict


@dataclass(frozen=True, slots=True)
class Check:
    comparison: MetricComparison
    limit: float  # relative share, or the absolute error-rate ceiling
    status: str  # PASS, FAIL, INCONCLUSIVE

    @property
    def metric(self) -> str:
        return self.comparison.metric

    @property
    def enforced(self) -> bool:
        """Could these runs catch a breach of the limit? A failed check caught one. The error-rate
        ceiling needs no test, only the candidate's finished requests. A statistical check needs a
        test whose smallest detectable change (80% power) is at most the limit: a check that could
        detect only changes above its limit would pass a regression of the limit's size unseen."""
        c = self.comparison
        if self.status == FAIL:
            return True
        if self.metric == "error_rate":
            return c.candidate is not None
        return c.significant is not None and c.detectable is not None and c.detectable <= self.limit


@dataclass(frozen=True, slots=True)
class Unenforced:
    """A gated metric's checks that these runs could not enforce, and why."""

    metric: str
    limit: float
    levels: tuple[int | float, ...]  # where, in the comparison's order
    untested: str | None  # why there was no test, or no power to judge (the comparison's note), or None
    detectable: float | None  # when tested: the largest smallest-detectable change of these checks
    tested: bool = False  # a test ran, but too few degrees of freedom to say what it detects


@dataclass(frozen=True, slots=True)
class GateResult:
    config: GateConfig
    comparison: RunComparison
    checks: tuple[Check, ...]
    check_confidence: float  # what each statistical check is tested at

    def with_status(self, status: str) -> list[Check]:
        return [c for c in self.checks if c.status == status]

    @property
    def not_enforced(self) -> list[Check]:
        return [c for c in self.checks if not c.enforced]

    @property
    def enforced_nothing(self) -> bool:
        """None of the limits on throughput or latency could be enforced (the error-rate ceiling alone
        says nothing of a slowdown); with only the error rate gated, none of its checks could."""
        statistical = [c for c in self.checks if c.metric != "error_rate"] or list(self.checks)
        return not any(c.enforced for c in statistical)

    @property
    def exit_code(self) -> int:
        """1 on a regression (or an inconclusive check with `strict`); else EXIT_NOT_ENFORCED when
        nothing could be enforced; else 0."""
        if self.with_status(FAIL) or (self.config.strict and self.with_status(INCONCLUSIVE)):
            return EXIT_FAILED
        if self.enforced_nothing:
            return EXIT_NOT_ENFORCED
        return EXIT_OK

    def unenforced(self) -> list[Unenforced]:
        """The checks not enforced, grouped by metric and by why: no test (per reason), a test whose
        power is unknown (one degree of freedom), or a test blind to a change of the limit's size."""
        groups: dict[tuple[str, str | None, bool], list[Check]] = {}
        for check in self.not_enforced:
            c = check.comparison
            blind = c.significant is not None and c.detectable is not None
            groups.setdefault((check.metric, None if blind else _untested_reason(c), c.significant is not None),
                              []).append(check)
        out = []
        for (metric, untested, tested), checks in groups.items():
            known = [c.comparison.detectable for c in checks if c.comparison.detectable is not None]
            out.append(Unenforced(metric, checks[0].limit, tuple(c.comparison.concurrency for c in checks),
                                  untested, None if untested or not known else max(known), tested))
        return out

    def detectable(self) -> dict[str, float | None]:
        """Per gated metric, the smallest relative change these runs detect at every gated level
        (the largest over the levels); None where some level has no test at all."""
        out: dict[str, float | None] = {}
        for check in self.checks:
            if check.metric == "error_rate":
                continue
            d = check.comparison.detectable if check.comparison.significant is not None else None
            prev = out.get(check.metric, 0.0)
            out[check.metric] = None if d is None or prev is None else max(prev, d)
        return out

    def limits_below_detection(self) -> list[tuple[str, float, float | None]]:
        """(metric, limit, detectable) for each limit these runs cannot enforce."""
        return [(metric, self.config.limits[metric], d) for metric, d in self.detectable().items()
                if d is None or d > self.config.limits[metric]]


def _untested_reason(comparison: MetricComparison) -> str:
    """The comparison's note without its advice: "one run a side and no noise floor"."""
    note = comparison.note or "no test"
    return note.split(":")[0].split(" (")[0]


def check_confidence(confidence: float, statistical_checks: int) -> float:
    """Bonferroni: each of k checks at 1 - (1 - confidence) / k."""
    return 1.0 - (1.0 - confidence) / max(1, statistical_checks)


def judge(comparison: MetricComparison, config: GateConfig) -> Check:
    """One check's status from its comparison and its limit.

    FAIL: worse by more than the limit, and the runs say it is more than run-to-run noise.
    INCONCLUSIVE: worse by more than the limit, but the runs cannot tell (no test: one run a side
    and no noise floor; or a test that does not exclude noise, which means the smallest change
    these runs detect is above the limit). Never a regression without a test.
    """
    if comparison.metric == "error_rate":
        limit = config.max_error_rate
        if comparison.candidate is None:
            return Check(comparison, limit, INCONCLUSIVE)
        return Check(comparison, limit, FAIL if comparison.candidate > limit + 1e-12 else PASS)
    limit = config.limits[comparison.metric]
    change = comparison.change
    if change is None:
        return Check(comparison, limit, INCONCLUSIVE)
    if not comparison.worse or abs(change) <= limit:
        return Check(comparison, limit, PASS)
    return Check(comparison, limit, FAIL if comparison.significant else INCONCLUSIVE)


def run_gate(baseline: Sequence[RunData], candidate: Sequence[RunData], config: GateConfig, *,
             floors: NoiseFloors | None = None) -> GateResult:
    """Compare the gated metrics of two sides (one run or several each) and judge each. Raises
    CompareError when they are not comparable."""
    comparison = compare_sides(baseline, candidate, confidence=config.confidence, floors=floors,
                               only=config.metrics, error_rate_tested=False)
    checks = tuple(judge(m, config) for level in comparison.levels for m in level.metrics)
    return GateResult(config, comparison, checks, comparison.check_confidence)
