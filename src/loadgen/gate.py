"""The regression gate: which checks to run, their limits, and the verdict over a `compare` of two runs.

A check fails only when the candidate is worse than the baseline by more than its limit AND the
difference is significant. "Significant but within the limit" passes; "beyond the limit but not
significant" passes with a note (noise is never called a change); a check the data is too small
to decide is *inconclusive*: a warning, or a failure with `strict`. The error rate is the
exception: it is an absolute ceiling on the candidate's failed / (ok + failed), with no test.

`confidence` is that of the whole gate. With k statistical checks (metrics x levels, error rate
excluded), each is tested at 1 - (1 - confidence) / k (Bonferroni), so the chance that noise fails
the gate somewhere stays below 1 - confidence however many levels a sweep has.

Limits come from defaults, then the `[gate]` table of a TOML file, then the command line.
Everything here is pure except `load_gate_file`, which reads that file.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from .compare import METRICS, Metric, MetricComparison, RunComparison, check_comparable, compare_runs, plan_levels
from .core.errors import UserError
from .core.records import RequestRecord, level_name

DEFAULT_METRICS = ("throughput", "latency_p50", "latency_p99", "error_rate")
DEFAULT_LIMITS = {  # worse by more than this share fails
    "throughput": 0.05,
    "decode_tok_s": 0.05,
    "latency_p50": 0.05,
    "latency_p99": 0.10,
    "queue_wait_p50": 0.10,
}
DEFAULT_MAX_ERROR_RATE = 0.0
DEFAULT_CONFIDENCE = 0.95

# keys of --max-throughput-drop and --max-latency-rise ("p99:10%,p50:5%"); a bare "10%" sets them all
DROP_KEYS = {"throughput": "throughput", "decode": "decode_tok_s", "decode_tok_s": "decode_tok_s"}
RISE_KEYS = {"p50": "latency_p50", "p99": "latency_p99", "queue_wait": "queue_wait_p50",
             "latency_p50": "latency_p50", "latency_p99": "latency_p99", "queue_wait_p50": "queue_wait_p50"}
METRIC_ALIASES = {"queue_wait": "queue_wait_p50", "p50": "latency_p50", "p99": "latency_p99", "decode": "decode_tok_s"}
FILE_KEYS = ("max_throughput_drop", "max_latency_rise", "max_error_rate", "confidence", "metrics", "strict")

PASS, FAIL, NOT_SIGNIFICANT, INCONCLUSIVE = "pass", "fail", "not significant", "inconclusive"


class GateConfigError(UserError, ValueError):
    """A bad limit, flag or gate file; the message is one line: `where: what is wrong`."""


@dataclass(frozen=True, slots=True)
class GateConfig:
    limits: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    confidence: float = DEFAULT_CONFIDENCE
    metrics: tuple[str, ...] = DEFAULT_METRICS
    strict: bool = False

    @property
    def statistical_metrics(self) -> tuple[str, ...]:
        return tuple(m for m in self.metrics if m != "error_rate")


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
        share = parse_share(value, where)
        return {metric: share for metric in dict.fromkeys(keys.values())}
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


def load_gate_file(path: Path) -> dict[str, Any]:
    """Read and check the [gate] table of a TOML file; errors read `file: key: what is wrong`."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GateConfigError(f"{path}: not found") from None
    except OSError as exc:
        raise GateConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise GateConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise GateConfigError(f"{path}: not valid TOML ({exc})") from None
    unknown = [key for key in data if key != "gate"]
    if unknown:
        raise GateConfigError(f"{path}: {unknown[0]}: unknown table or key; only a [gate] table is read")
    table = data.get("gate")
    if not isinstance(table, dict):
        raise GateConfigError(f"{path}: gate: missing; put the settings under a [gate] table")
    return parse_settings(table, lambda key: f"{path}: {key}")


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
    status: str  # PASS, FAIL, NOT_SIGNIFICANT, INCONCLUSIVE

    @property
    def metric(self) -> str:
        return self.comparison.metric


@dataclass(frozen=True, slots=True)
class GateResult:
    config: GateConfig
    comparison: RunComparison
    checks: tuple[Check, ...]
    check_confidence: float  # what each statistical check is tested at

    def with_status(self, status: str) -> list[Check]:
        return [c for c in self.checks if c.status == status]

    @property
    def exit_code(self) -> int:
        if self.with_status(FAIL) or (self.config.strict and self.with_status(INCONCLUSIVE)):
            return 1
        return 0


def check_confidence(confidence: float, statistical_checks: int) -> float:
    """Bonferroni: each of k checks at 1 - (1 - confidence) / k."""
    return 1.0 - (1.0 - confidence) / max(1, statistical_checks)


def judge(comparison: MetricComparison, config: GateConfig) -> Check:
    """One check's status from its comparison and its limit."""
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
    if comparison.significant is None:
        return Check(comparison, limit, INCONCLUSIVE)
    return Check(comparison, limit, FAIL if comparison.significant else NOT_SIGNIFICANT)


def run_gate(baseline: Mapping[str, Any], baseline_records: Sequence[RequestRecord],
             candidate: Mapping[str, Any], candidate_records: Sequence[RequestRecord],
             config: GateConfig, *, seed: int = 0) -> GateResult:
    """Compare the gated metrics of two runs and judge each. Raises CompareError when they are not comparable."""
    check_comparable(baseline, candidate)
    plan = plan_levels(baseline, baseline_records, candidate, candidate_records)
    per_check = check_confidence(config.confidence, len(plan.pairs) * len(config.statistical_metrics))
    comparison = compare_runs(baseline, baseline_records, candidate, candidate_records,
                              confidence=per_check, seed=seed, only=config.metrics)
    checks = tuple(judge(m, config) for level in comparison.levels for m in level.metrics)
    return GateResult(config, comparison, checks, per_check)


# ---------------------------------------------------------------- saying it


def format_value(metric: str, value: float | None, unit: bool = True) -> str:
    if value is None:
        return "n/a"
    if metric == "error_rate":
        return f"{value:.1%}"
    return f"{value:,.1f} {METRICS[metric].unit}" if unit else f"{value:,.1f}"


def format_change(comparison: MetricComparison) -> str:
    change = comparison.change
    if change is None:
        return "n/a"
    if comparison.metric == "error_rate":
        return f"{change * 100:+.1f} pp"
    return f"{change:+.1%}"


def format_limit(check: Check) -> str:
    if check.metric == "error_rate":
        return f"max {check.limit:.1%}"
    return f"{'-' if METRICS[check.metric].higher_is_better else '+'}{check.limit:.0%}"


def format_evidence(comparison: MetricComparison, confidence: float) -> str:
    """The p-value and/or interval behind a significance call, or why there is none."""
    parts = []
    if comparison.p_value is not None:
        test = "Fisher" if comparison.metric == "error_rate" else "Mann-Whitney"
        parts.append(f"{test} p={comparison.p_value:.2g}")
    if comparison.ci_low is not None and comparison.ci_high is not None:
        parts.append(f"{_percent(confidence)} CI of ratio {comparison.ci_low:.3f}-{comparison.ci_high:.3f}")
    if comparison.note:
        parts.append(comparison.note)
    return ", ".join(parts) or "no test"


def format_significant(comparison: MetricComparison) -> str:
    return {True: "yes", False: "no", None: "n/a"}[comparison.significant]


def _percent(share: float) -> str:
    text = f"{share * 100:.2f}".rstrip("0").rstrip(".")
    return f"{text}%"


def _level(level: int | float) -> str:
    """Concurrency levels are integers; open-loop rates are floats (requests/s)."""
    return level_name(level, isinstance(level, float))


def _where(comparison: MetricComparison) -> str:
    return f"{comparison.target} at {_level(comparison.concurrency)}"


def check_line(check: Check, confidence: float) -> str:
    """One line per check that did not simply pass: metric, target, level, both values, evidence."""
    c = check.comparison
    values = f"{format_value(c.metric, c.baseline)} -> {format_value(c.metric, c.candidate)}"
    if check.metric == "error_rate":
        figures = f"{values} ({format_limit(check)})"
        evidence = f"{round((c.candidate or 0) * c.n_candidate)} of {c.n_candidate} requests failed"
    else:
        figures = f"{values} ({format_change(c)}, limit {format_limit(check)})"
        evidence = format_evidence(c, confidence)
    head = {FAIL: "REGRESSION", NOT_SIGNIFICANT: "not significant", INCONCLUSIVE: "inconclusive",
            PASS: "ok"}[check.status]
    tail = {NOT_SIGNIFICANT: "; within noise, not counted"}
    return f"{head}: {c.metric} {_where(c)}: {figures}; {evidence}{tail.get(check.status, '')}"


def summary_line(result: GateResult) -> str:
    failed, noise, unsure = (len(result.with_status(s)) for s in (FAIL, NOT_SIGNIFICANT, INCONCLUSIVE))
    levels = len(result.comparison.levels)
    extras = [f"{n} {what}" for n, what in ((noise, "beyond the limit but not significant"),
                                            (unsure, "inconclusive")) if n]
    tested = (f"{len(result.checks)} checks on {levels} level{'s' if levels != 1 else ''}, each at "
              f"{_percent(result.check_confidence)} confidence for {_percent(result.config.confidence)} overall")
    if result.exit_code:
        why = f"{failed} regression{'s' if failed != 1 else ''}" if failed else "inconclusive checks with --strict"
        return f"gate: FAILED, {why} ({tested}{'; ' + ', '.join(extras) if extras else ''})"
    return f"gate: passed ({tested}{'; ' + ', '.join(extras) if extras else ''})"


def _markdown_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def comparison_markdown(comparison: RunComparison) -> str:
    """The comparison as a Markdown table, skipped levels and warnings below it."""
    lines = [_markdown_row(["target", "C", "metric", "baseline", "candidate", "change", "significant", "evidence"]),
             _markdown_row(["---", "---:", "---", "---:", "---:", "---:", "---", "---"])]
    for level in comparison.levels:
        for m in level.metrics:
            lines.append(_markdown_row([m.target, m.concurrency, m.metric, format_value(m.metric, m.baseline),
                                        format_value(m.metric, m.candidate), format_change(m), format_significant(m),
                                        format_evidence(m, comparison.confidence)]))
    return "\n".join(lines + _notes_markdown(comparison)) + "\n"


def gate_markdown(result: GateResult) -> str:
    """A GitHub step summary: verdict, then every check."""
    icon = {PASS: "pass", FAIL: "**REGRESSION**", NOT_SIGNIFICANT: "not significant", INCONCLUSIVE: "inconclusive"}
    lines = [f"### loadgen gate: {'FAILED' if result.exit_code else 'passed'}", "", summary_line(result), "",
             _markdown_row(["target", "C", "metric", "baseline", "candidate", "change", "limit", "evidence", "result"]),
             _markdown_row(["---", "---:", "---", "---:", "---:", "---:", "---:", "---", "---"])]
    for check in result.checks:
        m = check.comparison
        lines.append(_markdown_row([m.target, m.concurrency, m.metric, format_value(m.metric, m.baseline),
                                    format_value(m.metric, m.candidate), format_change(m), format_limit(check),
                                    format_evidence(m, result.check_confidence), icon[check.status]]))
    return "\n".join(lines + _notes_markdown(result.comparison)) + "\n"


def _notes_markdown(comparison: RunComparison) -> list[str]:
    lines = []
    if comparison.skipped:
        lines += ["", "Skipped: " + "; ".join(comparison.skipped) + "."]
    if comparison.warnings:
        lines += ["", "Warnings: " + "; ".join(comparison.warnings) + "."]
    return lines


def short_evidence(comparison: MetricComparison) -> str:
    """The significance call with its main figure, narrow enough for a terminal column."""
    if comparison.significant is None:
        return "untested"
    call = "yes" if comparison.significant else "no"
    if comparison.p_value is not None:
        return f"{call}, p={comparison.p_value:.2g}"
    return f"{call}, CI {comparison.ci_low:.2f}-{comparison.ci_high:.2f}"


def comparison_table(comparison: RunComparison) -> Table:
    """The comparison for a terminal: one row per metric, levels grouped; notes go below it."""
    table = Table(title=f"loadgen compare (significant at {_percent(comparison.confidence)}; "
                        "CI: interval of candidate/baseline)", header_style="bold underline", box=None,
                  pad_edge=False)
    for name, justify in [("target @ C", "left"), ("metric", "left"), ("baseline", "right"), ("candidate", "right"),
                          ("change", "right"), ("significant", "left")]:
        table.add_column(name, justify=justify, no_wrap=True)
    for level in comparison.levels:
        first = True
        for m in level.metrics:
            style = ("red" if m.worse else "green") if m.significant else ""
            table.add_row(f"{m.target} @{m.concurrency}" if first else "", _metric_label(m.spec),
                          format_value(m.metric, m.baseline, unit=False),
                          format_value(m.metric, m.candidate, unit=False), Text(format_change(m), style=style),
                          short_evidence(m))
            first = False
        table.rows[-1].end_section = True
    return table


def _metric_label(spec: Metric) -> str:
    return spec.title if spec.unit in spec.title else f"{spec.title} {spec.unit}".strip()


def untested_notes(comparison: RunComparison) -> list[str]:
    """Why untested metrics were not tested: one line per metric and reason, naming the levels."""
    levels: dict[tuple[str, str, str], list[str]] = {}
    for level in comparison.levels:
        for m in level.metrics:
            if m.significant is None and m.note:
                reason = m.note.split(" (have ")[0]  # the counts differ per level; the reason does not
                levels.setdefault((m.metric, m.target, reason), []).append(m.concurrency)
    return [f"untested: {metric} {target} at {_levels(cs)}: {reason}"
            for (metric, target, reason), cs in levels.items()]


def _levels(levels: list[int | float]) -> str:
    if isinstance(levels[0], float):
        return ", ".join(f"{c:g}" for c in levels) + " req/s"
    return "concurrency " + ", ".join(str(c) for c in levels)
