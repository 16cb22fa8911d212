"""Terminal rendering of a run document (run.json's content). Reads data, computes nothing new."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..analysis.depth import SKIP_HINT
from ..core.records import level_name
from ..core.rundoc import is_open_loop


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _dist(level: dict[str, Any], key: str, stat: str) -> float | None:
    d = level.get(key)
    return d.get(stat) if isinstance(d, dict) else None


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "n/a"
    return f"{a / b:.2f}×"


def _level_name(doc: dict[str, Any], level: int | float) -> str:
    return level_name(level, is_open_loop(doc))


def sweep_table(doc: dict[str, Any]) -> Table:
    """One row per level × target, levels grouped; the last column compares the first two targets."""
    targets = doc["targets"]
    pair = [t for t in targets if t.get("levels")][:2]
    ratio_title = f"{pair[0]['label']}/{pair[1]['label']}\nthroughput" if len(pair) == 2 else None
    title = "loadgen sweep" + ("" if doc.get("complete", True) else "  \\[incomplete]")  # \[: not Rich markup
    table = Table(title=title, header_style="bold", show_lines=False)
    open_loop = is_open_loop(doc)
    # open loop: the rate the requests actually left at beside the nominal one (n/a in older files)
    achieved = [("achieved\nreq/s", "right")] if open_loop else []
    for name, justify in [("req/s" if open_loop else "C", "right"), ("target", "left"), *achieved, ("ok/failed", "right"), ("out tok", "right"),
                          ("wall s", "right"), ("tok/s", "right"), ("decode tok/s\nper req", "right"),
                          ("latency ms\nmean", "right"), ("p50", "right"), ("p99", "right"), ("max", "right"),
                          ("predicted_ms\nmean", "right"), ("queue wait ms\nmean", "right")]:
        table.add_column(name, justify=justify)
    if ratio_title:
        table.add_column(ratio_title, justify="right")
    levels = sorted({lv["level"] for t in targets for lv in t.get("levels", [])})
    for c in levels:
        by_target = {t["label"]: next((lv for lv in t.get("levels", []) if lv["level"] == c), None)
                     for t in targets}
        first = True
        for t in targets:
            lv = by_target[t["label"]]
            if lv is None:
                continue
            failed = lv["requests_failed"]
            okf = Text(f"{lv['requests_ok']}/{failed}", style="red" if failed else "")
            row = [f"{c:g}" if first else "", t["label"], *([_fmt(lv.get("achieved_rate"), 2)] if open_loop else []),
                   okf, f"{lv['output_tokens']:,}", _fmt(lv["wall_s"], 2),
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
                lines.append(f"{t['label']} at {_level_name(doc, lv['level'])}: {kinds}")
    return lines


def reach_lines(doc: dict[str, Any]) -> list[str]:
    """One warning per closed-loop level that ran to its end without ever having its concurrency in
    flight (a duration shorter than a request, or a stagger longer than one); a level its target
    ended early says so elsewhere."""
    if is_open_loop(doc):
        return []
    lines = []
    for t in doc["targets"]:
        for lv in t.get("levels", []):
            reached = lv.get("concurrency_reached")
            if reached is None or reached >= lv["concurrency"] or lv.get("stopped_reason"):
                continue
            lines.append(f"warning: {t['label']} at {_level_name(doc, lv['level'])}: at most {reached} "
                         f"request{' was' if reached == 1 else 's were'} in flight, so that level's figures are not "
                         f"those of concurrency {lv['concurrency']}")
    return lines


def queue_table(doc: dict[str, Any]) -> Table | None:
    """Per target and level: queued requests, queue wait, the deferred queue, busy slots, gain.

    The queue wait shown is the level's `queue_wait_ms` (metrics.queue_wait_ms, raw: not corrected
    for the c=1 overhead), the same figure the sweep table, the HTML and Markdown reports and the CSV
    show under that name; the overhead correction only decides which requests count as queued."""
    rows = [(t, lv) for t in doc["targets"] if t.get("verdict") for lv in t["verdict"]["levels"]]
    if not rows:
        return None
    table = Table(title="queuing and saturation", header_style="bold")
    for name in ("target", "req/s" if is_open_loop(doc) else "C", "queued", "queue wait ms\np50", "p99", "max", "peak\ndeferred",
                 "peak busy\n/ slots", "batching\ngain"):
        table.add_column(name, justify="left" if name == "target" else "right")
    last = None
    for t, lv in rows:
        v = t["verdict"]
        summary = next((x for x in t.get("levels", []) if x["level"] == lv["level"]), {})
        qw = summary.get("queue_wait_ms") or {}
        slots = v.get("total_slots")
        busy = lv.get("peak_busy_slots")
        table.add_row(
            t["label"] if t["label"] != last else "", f"{lv['level']:g}",
            f"{lv['queued']}/{lv['requests']} ({lv['queued_share']:.0%})",
            _fmt(qw.get("p50"), 0), _fmt(qw.get("p99"), 0), _fmt(qw.get("max"), 0),
            _fmt(lv.get("peak_deferred"), 0),
            f"{'n/a' if busy is None else busy} / {'?' if slots is None else slots}",
            "n/a" if lv.get("batching_gain") is None else f"{lv['batching_gain']:.2f}×",
        )
        last = t["label"]
    return table


# (column title, summary key, statistic) of the latency detail table, shown when any level has them.
_DETAIL = [("TTFT ms\np50", "ttft_ms", "p50"), ("TTFT\np99", "ttft_ms", "p99"),
           ("TTFT−prompt_ms\np50 (queue)", "ttft_queue_ms", "p50"), ("TPOT ms\nmean", "tpot_ms", "mean"),
           ("ITL ms\np50", "itl_ms", "p50"), ("ITL\np99", "itl_ms", "p99"),
           ("E2E ms p99\nfrom intended", "latency_ms", "p99"),
           ("E2E p99\nfrom actual send", "latency_uncorrected_ms", "p99"),
           ("send lag ms\np99", "schedule_lag_ms", "p99")]


def latency_table(doc: dict[str, Any]) -> Table | None:
    """Streaming and open-loop latencies (TTFT, TPOT, ITL, corrected vs uncorrected E2E, send lag)."""
    rows = [(t, lv) for t in doc["targets"] for lv in t.get("levels", [])]
    columns = [c for c in _DETAIL if any(isinstance(lv.get(c[1]), dict) for _, lv in rows)]
    if not any(key != "latency_ms" for _, key, _ in columns):
        return None
    table = Table(title="latency detail (ms)", header_style="bold")
    table.add_column("target")
    table.add_column("req/s" if is_open_loop(doc) else "C", justify="right")
    for title, _, _ in columns:
        table.add_column(title, justify="right")
    last = None
    for t, lv in rows:
        table.add_row(t["label"] if t["label"] != last else "", f"{lv['level']:g}",
                      *[_fmt(_dist(lv, key, stat), 1 if key in ("tpot_ms", "itl_ms", "schedule_lag_ms") else 0)
                        for _, key, stat in columns])
        last = t["label"]
    return table


def verdict_lines(doc: dict[str, Any]) -> list[str]:
    return [line for t in doc["targets"] if t.get("verdict") for line in t["verdict"]["verdict"]]


def overhead_lines(doc: dict[str, Any]) -> list[str]:
    out = []
    for t in doc["targets"]:
        v = t.get("verdict")
        if v and v.get("overhead_ms") is not None:
            out.append(f"{t['label']}: fixed overhead at c=1 (tokenization + HTTP) {v['overhead_ms']:.1f} ms, "
                       "subtracted from a request's queue wait before it counts as queued")
    return out


def connection_lines(doc: dict[str, Any]) -> list[str]:
    """One line per target whose requests opened connections inside a level's clock: how many, at
    which levels, and what connecting took (part of those requests' latency). loadgen opens a
    level's connections before its clock starts, so these are the server's doing: a server that
    closes after every response (llama-server after a stream), or one that closed idle ones."""
    out = []
    for t in doc["targets"]:
        parts = []
        for lv in t.get("levels", []):
            opened = lv.get("connections_opened")
            if not opened:
                continue
            sent = lv["requests_ok"] + lv["requests_failed"]
            p50 = _dist(lv, "connect_ms", "p50")
            every = "every request" if opened >= sent else f"{opened:,} of {sent:,} requests"
            parts.append(f"{every} at {_level_name(doc, lv['level'])}"
                         + (f" (connect p50 {p50:.2f} ms)" if p50 is not None else ""))
        if parts:
            out.append(f"{t['label']}: opened a new connection for {'; '.join(parts)}, "
                       "which their latency includes")
    return out


def _pm(stat: dict[str, Any] | None, digits: int = 1) -> str:
    """mean ± sd of a MeanSd dict, or n/a."""
    if not stat:
        return "n/a"
    sd = stat.get("sd")
    return f"{stat['mean']:,.{digits}f}" + (f" ± {sd:,.{digits}f}" if sd is not None else "")


def _okf(row: dict[str, Any]) -> Text:
    failed = row["requests_failed"]
    return Text(f"{row['requests_ok']}/{failed}", style="red" if failed else "")


def _title(kind: str, doc: dict[str, Any]) -> str:
    return f"loadgen {kind}" + ("" if doc.get("complete", True) else "  [incomplete]")


def prefill_table(doc: dict[str, Any]) -> Table:
    """Per prompt length × target: prompt_n, prompt_ms, prompt tok/s, client TTFT; the first two
    targets' prefill speed ratio."""
    targets = [t for t in doc["targets"] if t.get("prefill")]
    pair = targets[:2] if len(targets) >= 2 else []
    table = Table(title=_title("prefill", doc), header_style="bold")
    for name in ("prompt\ntokens", "target", "ok/failed", "prompt_n", "prompt_ms", "prompt tok/s", "TTFT ms\n(client)"):
        table.add_column(name, justify="left" if name == "target" else "right")
    if pair:
        table.add_column(f"{pair[0]['label']}/{pair[1]['label']}\nprompt tok/s", justify="right")
    table.add_column("note", justify="left", style="dim")
    lengths = sorted({r["prompt_tokens"] for t in targets for r in t["prefill"]["rows"]})
    for n in lengths:
        rows = {t["label"]: next((r for r in t["prefill"]["rows"] if r["prompt_tokens"] == n), None) for t in targets}
        first = True
        for t in targets:
            r = rows[t["label"]]
            if r is None:
                continue
            pn = r.get("prompt_n")
            count = "n/a" if not pn else (f"{r['prompt_n_min']:,}" if r["prompt_n_min"] == r["prompt_n_max"]
                                          else f"{r['prompt_n_min']:,}-{r['prompt_n_max']:,}")
            cells = [f"{n:,}" if first else "", t["label"], _okf(r), count, _pm(r["prompt_ms"], 0),
                     _pm(r["prompt_tok_s"], 1), _pm(r["ttft_ms"], 0)]
            if pair:
                a, b = (rows.get(p["label"]) for p in pair)
                speed = [(x or {}).get("prompt_tok_s") for x in (a, b)]
                cells.append(_ratio(speed[0]["mean"], speed[1]["mean"]) if first and all(speed) else "")
            cells.append(r.get("skipped") or r.get("note") or "")
            table.add_row(*cells)
            first = False
        if table.rows:
            table.rows[-1].end_section = True
    return table


def depth_table(doc: dict[str, Any]) -> Table:
    """Per target × depth: decode tok/s and its change against depth 0; skipped depths say why."""
    table = Table(title=_title("depth", doc), header_style="bold")
    for name in ("target", "depth", "ok/failed", "prompt_n", "decode tok/s", "vs depth 0", "note"):
        table.add_column(name, justify="left" if name in ("target", "note") else "right",
                         style="dim" if name == "note" else None)
    for t in doc["targets"]:
        section = t.get("depth")
        if not section:
            continue
        for i, r in enumerate(section["rows"]):
            ref = r.get("reference_depth")
            change = r.get("change")
            change_text = "n/a" if change is None else ("—" if r["depth"] == ref else f"{change:+.1%}")
            if change is not None and ref not in (0, None) and r["depth"] != ref:
                change_text += f" (vs {ref:,})"
            if r.get("skipped"):
                cells = [t["label"] if i == 0 else "", f"{r['depth']:,}", "—", "—", "—", "—", r["skipped"]]
            else:
                cells = [t["label"] if i == 0 else "", f"{r['depth']:,}", _okf(r), _pm(r["prompt_n"], 0),
                         _pm(r["decode_tok_s"], 2), change_text, r.get("note") or ""]
            table.add_row(*cells, end_section=i == len(section["rows"]) - 1)
    return table


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def soak_table(doc: dict[str, Any]) -> Table:
    """Per target: requests, errors by kind, the load offered, throughput, error-free time and drift."""
    table = Table(title=_title("soak", doc), header_style="bold")
    for name in ("target", "duration", "ok/failed", "errors", "offered\nreq/s", "tok/s", "error-free", "longest\nerror-free",
                 "first → last window\ntok/s", "drift"):
        table.add_column(name, justify="left" if name in ("target", "errors") else "right")
    for t in doc["targets"]:
        s = t.get("soak")
        if not s:
            continue
        errors = ", ".join(f"{k} ×{n}" for k, n in s["errors_by_kind"].items()) or "none"
        failed = s["requests_failed"]
        if s["drift"] is None:
            drift = "n/a (too short)"
        else:
            verdict = {True: "significant", False: "noise", None: "untested"}[s["drift_significant"]]
            drift = f"{s['drift']:+.1%} ({verdict})"
        first, last = s["first_throughput_tok_s"], s["last_throughput_tok_s"]
        table.add_row(t["label"], _hours(s["duration_s"]),
                      Text(f"{s['requests_ok']}/{failed}", style="red" if failed else ""),
                      Text(errors, style="red" if failed else ""), _fmt(s.get("offered_req_s"), 2),  # None: older file
                      _fmt(s["throughput_tok_s"], 2),
                      f"{_hours(s['error_free_s'])} of {_hours(s['duration_s'])}", _hours(s["longest_error_free_s"]),
                      "n/a" if first is None else f"{first:,.1f} → {last:,.1f}", drift)
    return table


def print_run(doc: dict, console: Console, err: Console) -> None:
    """The tables and verdicts of a run document: the same after a sweep and from `analyze`."""
    if any(t.get("levels") for t in doc["targets"]):
        console.print(sweep_table(doc))
    for table in (latency_table(doc), queue_table(doc)):
        if table is not None:
            console.print(table)
    for line in (*overhead_lines(doc), *connection_lines(doc)):
        console.print(line, highlight=False, markup=False, style="dim", soft_wrap=True)
    for line in verdict_lines(doc):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for line in reach_lines(doc):
        err.print(line, style="yellow", highlight=False, markup=False, soft_wrap=True)
    for line in error_lines(doc):
        err.print(line, style="red", highlight=False, markup=False, soft_wrap=True)


def print_mode(doc: dict[str, Any], console: Console, err: Console) -> None:
    """The table of a prefill, depth or soak run document (after the run, and from `analyze`)."""
    kind = doc.get("kind")
    if kind == "prefill":
        console.print(prefill_table(doc))
    elif kind == "depth":
        console.print(depth_table(doc))
    elif kind == "soak":
        console.print(soak_table(doc))
    sections = [t.get(kind) for t in doc["targets"] if kind in ("prefill", "depth")]
    if any("per-slot n_ctx" in (r.get("skipped") or "") for s in sections if s for r in s["rows"]):
        console.print(SKIP_HINT, style="dim", highlight=False, markup=False, soft_wrap=True)
    for line in error_lines(doc):
        err.print(line, style="red", highlight=False, markup=False, soft_wrap=True)
