"""Terminal rendering of a run document (run.json's content). Reads data, computes nothing new."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _dist(level: dict[str, Any], key: str, stat: str) -> float | None:
    d = level.get(key)
    return d.get(stat) if isinstance(d, dict) else None


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "n/a"
    return f"{a / b:.2f}×"


def sweep_table(doc: dict[str, Any]) -> Table:
    """One row per level × target, levels grouped; the last column compares the first two targets."""
    targets = doc["targets"]
    pair = [t for t in targets if t.get("levels")][:2]
    ratio_title = f"{pair[0]['label']}/{pair[1]['label']}\nthroughput" if len(pair) == 2 else None
    title = "loadgen sweep" + ("" if doc.get("complete", True) else "  [incomplete]")
    table = Table(title=title, header_style="bold", show_lines=False)
    for name, justify in [("C", "right"), ("target", "left"), ("ok/failed", "right"), ("out tok", "right"),
                          ("wall s", "right"), ("tok/s", "right"), ("decode tok/s\nper req", "right"),
                          ("latency ms\nmean", "right"), ("p50", "right"), ("p99", "right"), ("max", "right"),
                          ("predicted_ms\nmean", "right"), ("queue wait ms\nmean", "right")]:
        table.add_column(name, justify=justify)
    if ratio_title:
        table.add_column(ratio_title, justify="right")
    levels = sorted({lv["concurrency"] for t in targets for lv in t.get("levels", [])})
    for c in levels:
        by_target = {t["label"]: next((lv for lv in t.get("levels", []) if lv["concurrency"] == c), None)
                     for t in targets}
        first = True
        for t in targets:
            lv = by_target[t["label"]]
            if lv is None:
                continue
            failed = lv["requests_failed"]
            okf = Text(f"{lv['requests_ok']}/{failed}", style="red" if failed else "")
            row = [str(c) if first else "", t["label"], okf, f"{lv['output_tokens']:,}", _fmt(lv["wall_s"], 2),
                   _fmt(lv["throughput_tok_s"], 2), _fmt(lv["decode_tok_s_mean"], 1),
                   _fmt(_dist(lv, "latency_ms", "mean"), 0), _fmt(_dist(lv, "latency_ms", "p50"), 0),
                   _fmt(_dist(lv, "latency_ms", "p99"), 0), _fmt(_dist(lv, "latency_ms", "max"), 0),
                   _fmt(lv["predicted_ms_mean"], 0), _fmt(_dist(lv, "queue_wait_ms", "mean"), 0)]
            if ratio_title:
                if first and all(by_target.get(p["label"]) for p in pair):
                    a, b = (by_target[p["label"]]["throughput_tok_s"] for p in pair)
                    row.append(_ratio(a, b))
                else:
                    row.append("")
            table.add_row(*row, end_section=False)
            first = False
        table.rows[-1].end_section = True
    return table


def error_lines(doc: dict[str, Any]) -> list[str]:
    """One line per target or level that had failures, naming the error kinds."""
    lines = []
    for t in doc["targets"]:
        if t.get("error"):
            lines.append(f"{t['label']}: {t['error']}")
        for lv in t.get("levels", []):
            if lv.get("errors_by_kind"):
                kinds = ", ".join(f"{k} ×{n}" for k, n in lv["errors_by_kind"].items())
                lines.append(f"{t['label']} at concurrency {lv['concurrency']}: {kinds}")
    return lines
