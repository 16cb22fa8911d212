"""`compare` and `gate` said in words: terminal tables, check lines and Markdown for a PR or CI summary.

The figures and verdicts are analysis/compare.py's and analysis/gate.py's; this module only formats them.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text

from ..analysis.compare import METRICS, Metric, MetricComparison, RunComparison
from ..analysis.gate import FAIL, INCONCLUSIVE, PASS, Check, GateResult
from ..core.errors import EXIT_FAILED, EXIT_NOT_ENFORCED
from ..core.records import level_name
from .layout import Column, Grid


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
        test = "Fisher" if comparison.metric == "error_rate" else f"t between runs ({comparison.method})"
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
    head = {FAIL: "REGRESSION", INCONCLUSIVE: "inconclusive", PASS: "ok"}[check.status]
    tail = "; the runs cannot tell this from run-to-run noise" if c.significant is False else ""
    return f"{head}: {c.metric} {_where(c)}: {figures}; {evidence}{tail}"


def runs_text(comparison: RunComparison) -> str:
    """"3+3 interleaved runs", "1+1 runs, noise floor from FILE"."""
    b, c = comparison.runs
    text = "1 run a side" if b == c == 1 else f"{b}+{c} {'interleaved ' if comparison.paired else ''}runs"
    return text + (f", noise floor from {comparison.floor}" if comparison.floor else "")


def detection_lines(result: GateResult) -> list[str]:
    """What these runs can detect, per gated metric, and a warning for each limit they cannot enforce."""
    detectable = result.detectable()
    if not detectable:
        return []
    known = [f"{METRICS[m].title} {d:.0%}" for m, d in detectable.items() if d is not None]
    lines = []
    if known:
        lines.append(f"with {runs_text(result.comparison)}: the smallest changes these runs detect are "
                     + ", ".join(known))
    for metric, limit, d in result.limits_below_detection():
        if d is None and result.comparison.runs == (1, 1) and not result.comparison.floor:
            lines.append(f"warning: {METRICS[metric].title}: one run a side and no noise floor, so no change can be "
                         "told from this machine's run-to-run drift; gate several interleaved runs a side "
                         "(`loadgen ab --repeat 3`) or calibrate (`loadgen calibrate`)")
        elif d is None:
            lines.append(f"warning: {METRICS[metric].title}: {runs_text(result.comparison)} give too few degrees of "
                         "freedom to say what they detect, so a regression is reported inconclusive, not caught; "
                         "gate 3 runs a side (`loadgen ab --repeat 3`) or calibrate (`loadgen calibrate`)")
        else:
            lines.append(f"warning: {METRICS[metric].title}: the limit {limit:.0%} is below the smallest change these "
                         f"runs detect ({d:.0%}); a regression between the two is reported inconclusive, not "
                         "caught: add runs or calibrate")
    return lines


def _share(share: float) -> str:
    """5.1%, 14%, 1,269%: a tenth of a percent below 10%, where a limit and a figure may be close."""
    return f"{share:.1%}" if share < 0.1 else f"{share:,.0%}"


def enforcement_text(result: GateResult) -> str:
    """"3 of 8 checks not enforced: latency p99 at concurrency 1, 4 could detect only changes above
    14%, the limit is 10%"; metrics untested at the same levels for the same reason share a clause;
    "" when every check was enforced."""
    clauses: dict[tuple, list[str]] = {}  # in order of first appearance
    for u in result.unenforced():
        title, where = METRICS[u.metric].title, _levels(list(u.levels))
        if u.untested is not None:
            verb = "of unknown power" if u.tested else "untested"
            clauses.setdefault((verb, u.untested, where), []).append(title)
        else:
            clauses[("blind", u.metric)] = [f"{title} at {where} could detect only changes above "
                                            f"{_share(u.detectable or 0.0)}, the limit is {_percent(u.limit)}"]
    if not clauses:
        return ""
    texts = [f"{', '.join(titles)} {key[0]} at {key[2]} ({key[1]})" if key[0] != "blind" else titles[0]
             for key, titles in clauses.items()]
    return f"{len(result.not_enforced)} of {_checks(len(result.checks))} not enforced: " + "; ".join(texts)


def _checks(n: int) -> str:
    return f"{n} check{'s' if n != 1 else ''}"


def summary_line(result: GateResult) -> str:
    """The gate's headline: passed, FAILED or not enforced, what was checked, and what could not be."""
    failed, unsure = (len(result.with_status(s)) for s in (FAIL, INCONCLUSIVE))
    levels = len(result.comparison.levels)
    extras = [f"{unsure} inconclusive"] if unsure else []
    tested = (f"{_checks(len(result.checks))} on {levels} level{'s' if levels != 1 else ''} over "
              f"{runs_text(result.comparison)}, each at {_percent(result.check_confidence)} confidence for "
              f"{_percent(result.config.confidence)} overall{'; ' + ', '.join(extras) if extras else ''}")
    enforcement = enforcement_text(result)
    if result.exit_code == EXIT_FAILED:
        why = f"{failed} regression{'s' if failed != 1 else ''}" if failed else "inconclusive checks with --strict"
        return f"gate: FAILED, {why} ({tested})" + (f"; {enforcement}" if enforcement else "")
    if result.exit_code == EXIT_NOT_ENFORCED:
        ceiling = any(c.enforced for c in result.checks if c.metric == "error_rate")
        held = "; only the error-rate ceiling was enforced, and it held" if ceiling else ""
        remedy = "add runs a side" + ("" if result.comparison.floor else " or a noise floor (`loadgen calibrate`)")
        return f"gate: not enforced ({tested}); {enforcement}{held}; to enforce it, {remedy}"
    return f"gate: passed ({tested})" + (f"; {enforcement}" if enforcement else "")


def verdict_word(result: GateResult) -> str:
    return {EXIT_FAILED: "FAILED", EXIT_NOT_ENFORCED: "not enforced"}.get(result.exit_code, "passed")


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
    """A GitHub step summary: verdict, then every check (and whether it was enforced)."""
    icon = {PASS: "pass", FAIL: "**REGRESSION**", INCONCLUSIVE: "inconclusive"}
    lines = [f"### loadgen gate: {verdict_word(result)}", "", summary_line(result), "",
             _markdown_row(["target", "C", "metric", "baseline", "candidate", "change", "limit", "evidence", "result"]),
             _markdown_row(["---", "---:", "---", "---:", "---:", "---:", "---:", "---", "---"])]
    for check in result.checks:
        m = check.comparison
        lines.append(_markdown_row([m.target, m.concurrency, m.metric, format_value(m.metric, m.baseline),
                                    format_value(m.metric, m.candidate), format_change(m), format_limit(check),
                                    format_evidence(m, result.check_confidence),
                                    icon[check.status] + ("" if check.enforced else ", not enforced")]))
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


def comparison_table(comparison: RunComparison) -> Grid:
    """The comparison for a terminal: one row per metric, levels grouped; notes go below it."""
    grid = Grid(f"loadgen compare ({runs_text(comparison)}; significant at {_percent(comparison.confidence)} "
                "overall; CI: interval of candidate/baseline)",
                [Column("target @ C", "left", key=True), Column("metric", "left", key=True), Column("baseline"),
                 Column("candidate"), Column("change"), Column("significant", "left")])
    for level in comparison.levels:
        first = True
        for m in level.metrics:
            style = ("red" if m.worse else "green") if m.significant else ""
            grid.add_row(f"{m.target} @{m.concurrency}" if first else "", _metric_label(m.spec),
                         format_value(m.metric, m.baseline, unit=False),
                         format_value(m.metric, m.candidate, unit=False), Text(format_change(m), style=style),
                         short_evidence(m))
            first = False
        grid.end_section()
    return grid


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
