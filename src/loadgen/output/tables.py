"""Terminal rendering of a run document (run.json's content). Reads data, computes nothing new."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from ..analysis.depth import SKIP_HINT
from ..core.records import level_name, level_short
from ..core.rundoc import KILLED_DURING_LEVEL, is_open_loop
from ..run.labels import about
from .layout import Cell, Column, Grid, Num, grids_csv, grids_json, grids_markdown, print_grid
from .cache import cache_table
from .workload import workload_table


def _dist(level: dict[str, Any], key: str, stat: str) -> float | None:
    d = level.get(key)
    return d.get(stat) if isinstance(d, dict) else None


def _ratio(a: float | None, b: float | None) -> Num:
    return Num(None if a is None or b is None or b <= 0 else a / b, 2, "×")


def _level_name(doc: dict[str, Any], level: int | float) -> str:
    return level_name(level, is_open_loop(doc))


def sweep_table(doc: dict[str, Any]) -> Grid:
    """One row per level × target, levels grouped; the last column compares the first two targets."""
    targets = doc["targets"]
    pair = [t for t in targets if t.get("levels")][:2]
    open_loop = is_open_loop(doc)
    # open loop: the rate the requests actually left at beside the nominal one (n/a in older files)
    columns = [Column("req/s" if open_loop else "C", key=True), Column("target", "left", key=True),
               *([Column("achieved\nreq/s")] if open_loop else []), Column("ok/failed"), Column("tok/s"),
               Column("latency ms\nmean"), Column("p50"), Column("p99"), Column("max"),
               Column("queue wait\nms mean"), Column("decode tok/s\nper req"), Column("out tok"), Column("wall s"),
               Column("predicted_ms\nmean")]
    caption = None
    if len(pair) == 2:
        columns.insert(5 if open_loop else 4, Column("tok/s\nratio"))
        caption = f"tok/s ratio: {pair[0]['label']} ÷ {pair[1]['label']}"
    grid = Grid(_title("sweep", doc), columns, caption=caption)
    levels = sorted({lv["level"] for t in targets for lv in t.get("levels", [])})
    for c in levels:
        by_target = {t["label"]: next((lv for lv in t.get("levels", []) if lv["level"] == c), None)
                     for t in targets}
        first = True
        for t in targets:
            lv = by_target[t["label"]]
            if lv is None:
                continue
            row: list[Cell] = [Num(c, None) if first else "", t["label"],
                               *([Num(lv.get("achieved_rate"), 2)] if open_loop else []), _okf(lv),
                               Num(lv["throughput_tok_s"], 2)]
            if caption:
                both = first and all(by_target.get(p["label"]) for p in pair)
                row.append(_ratio(*(by_target[p["label"]]["throughput_tok_s"] for p in pair)) if both else "")
            row += [Num(_dist(lv, "latency_ms", stat)) for stat in ("mean", "p50", "p99", "max")]
            row += [Num(_dist(lv, "queue_wait_ms", "mean")), Num(lv["decode_tok_s_mean"], 1),
                    Num(lv["output_tokens"]), Num(lv["wall_s"], 2), Num(lv["predicted_ms_mean"])]
            grid.add_row(*row)
            first = False
        grid.end_section()
    return grid


def error_lines(doc: dict[str, Any], told: bool = False) -> list[str]:
    """One line per target or level that had failures, naming the error kinds. `told`: the run
    itself said already why a target never started (right after the run; `analyze` says it)."""
    lines = []
    for t in doc["targets"]:
        # what the run told as it happened: a target that never answered (no server facts), skipped
        unanswered = t.get("server") is None and not any(t.get(k) for k in ("levels", "prefill", "depth", "soak"))
        if t.get("error") and not (told and unanswered):
            lines.append(about(t["label"], t["error"]))
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


def worker_death_lines(doc: dict[str, Any]) -> list[str]:
    """One warning per --workers process that died mid-level: when, the requests it lost, and the
    load the level offered from then on (run.json's per-level "workers")."""
    lines = []
    for t in doc["targets"]:
        for lv in t.get("levels", []):
            for w in lv.get("workers") or []:
                if not isinstance(w, dict) or w.get("died_at_s") is None:
                    continue
                if "rate_after" in w:
                    after = f"at {w['rate_after']:g} of {lv['level']:g} req/s"
                else:
                    after = f"at concurrency {w.get('concurrency_after')} of {lv['concurrency']}"
                lost = w.get("lost", 0)
                lines.append(f"warning: {t['label']} at {_level_name(doc, lv['level'])}: worker {w.get('worker')} died "
                             f"at {w['died_at_s']:.1f} s ({w.get('stopped_reason')}): the level ran {after} from "
                             f"then on; {lost} request{'' if lost == 1 else 's'} in flight recorded as lost")
    return lines


def killed_lines(doc: dict[str, Any]) -> list[str]:
    """One warning per level summarised from its records because the run was killed while it ran
    (results/unfinished.py): its figures are those of the requests recorded before the kill."""
    lines = []
    for t in doc["targets"]:
        for lv in t.get("levels", []):
            if lv.get("stopped_reason") == KILLED_DURING_LEVEL:
                n = sum(lv.get(k, 0) for k in ("requests_ok", "requests_failed", "requests_cancelled", "requests_lost"))
                lines.append(f"warning: {t['label']} {level_short(lv['level'], is_open_loop(doc))}: incomplete, the run "
                             f"was killed during this level; {n} request{'' if n == 1 else 's'} recorded")
    return lines


def queue_table(doc: dict[str, Any]) -> Grid | None:
    """Per target and level: queued requests, queue wait, the deferred queue, busy slots, gain.

    The queue wait shown is the level's `queue_wait_ms` (metrics.queue_wait_ms, raw: not corrected
    for the c=1 overhead), the same figure the sweep table, the HTML and Markdown reports and the CSV
    show under that name; the overhead correction only decides which requests count as queued. Of
    the queued, "for a slot" waited while every slot was busy, and "held outside" waited with a slot
    free (analysis/occupancy.py), the longest such wait beside them: neither is judged by a scrape
    (n/a where the records cannot tell: no slot count or no timings)."""
    rows = [(t, lv) for t in doc["targets"] if t.get("verdict") for lv in t["verdict"]["levels"]]
    if not rows:
        return None
    grid = Grid("queuing and saturation", [
        Column("target", "left", key=True), Column("req/s" if is_open_loop(doc) else "C", key=True),
        Column("queued"), Column("for a\nslot"), Column("held\noutside"), Column("outside\nmax ms"),
        Column("queue wait\nms p50"), Column("p99"), Column("max"), Column("peak\ndeferred"),
        Column("peak busy\nslots"), Column("slots"), Column("batching\ngain")])
    last = None
    for t, lv in rows:
        summary = next((x for x in t.get("levels", []) if x["level"] == lv["level"]), {})
        qw = summary.get("queue_wait_ms") or {}
        grid.add_row(t["label"] if t["label"] != last else "", Num(lv["level"], None),
                     f"{lv['queued']}/{lv['requests']} ({lv['queued_share']:.0%})",
                     *_held(lv), Num(qw.get("p50")), Num(qw.get("p99")), Num(qw.get("max")), Num(lv.get("peak_deferred")),
                     Num(lv.get("peak_busy_slots")), Num(t["verdict"].get("total_slots")),
                     Num(lv.get("batching_gain"), 2, "×"))
        last = t["label"]
    return grid


def _held(lv: dict[str, Any]) -> list[Any]:
    """A level's queued requests by cause (records-based only: a verdict written before has none)."""
    if lv.get("evidence") != "records":
        return [Num(None), Num(None), Num(None)]
    return [Num(lv.get("slot_queued")), Num(lv.get("held_outside")),
            Num(lv.get("held_outside_max_ms") if lv.get("held_outside") else None)]


# (column title, summary key, statistic) of the latency detail table, shown when any level has them.
_DETAIL = [("TTFT ms\np50", "ttft_ms", "p50"), ("TTFT\np99", "ttft_ms", "p99"),
           ("TTFT − prompt_ms\np50 (queue)", "ttft_queue_ms", "p50"), ("TPOT ms\nmean", "tpot_ms", "mean"),
           ("ITL ms\np50", "itl_ms", "p50"), ("ITL\np99", "itl_ms", "p99"),
           ("E2E ms p99\nfrom intended", "latency_ms", "p99"),
           ("E2E p99 from\nactual send", "latency_uncorrected_ms", "p99"),
           ("send lag\nms p99", "schedule_lag_ms", "p99")]


def latency_table(doc: dict[str, Any]) -> Grid | None:
    """Streaming and open-loop latencies (TTFT, TPOT, ITL, corrected vs uncorrected E2E, send lag)."""
    rows = [(t, lv) for t in doc["targets"] for lv in t.get("levels", [])]
    columns = [c for c in _DETAIL if any(isinstance(lv.get(c[1]), dict) for _, lv in rows)]
    if not any(key != "latency_ms" for _, key, _ in columns):
        return None
    grid = Grid("latency detail (ms)", [Column("target", "left", key=True),
                                        Column("req/s" if is_open_loop(doc) else "C", key=True),
                                        *[Column(title) for title, _, _ in columns]])
    last = None
    for t, lv in rows:
        grid.add_row(t["label"] if t["label"] != last else "", Num(lv["level"], None),
                     *[Num(_dist(lv, key, stat), 1 if key in ("tpot_ms", "itl_ms", "schedule_lag_ms") else 0)
                       for _, key, stat in columns])
        last = t["label"]
    return grid


def verdict_lines(doc: dict[str, Any]) -> list[str]:
    return [line for t in doc["targets"] if t.get("verdict") for line in t["verdict"]["verdict"]]


def overhead_lines(doc: dict[str, Any]) -> list[str]:
    out = []
    for t in doc["targets"]:
        v = t.get("verdict")
        if v and v.get("overhead_ms") is not None:
            out.append(f"{t['label']}: {v['overhead_ms']:.1f} ms of HTTP and tokenization at c=1, "
                       "not counted as queuing")
    return out


def connection_lines(doc: dict[str, Any]) -> list[str]:
    """One line per target whose requests opened connections inside a level's clock: how many, and
    what connecting took them (part of their latency; per level in run.json). loadgen opens a
    level's connections before its clock starts, so these are the server's doing: one that closes
    after every response (llama-server after a stream), or one that closed idle ones."""
    out = []
    for t in doc["targets"]:
        levels = [lv for lv in t.get("levels", []) if lv.get("connections_opened")]
        if not levels:
            continue
        opened = sum(lv["connections_opened"] for lv in levels)
        sent = sum(lv["requests_ok"] + lv["requests_failed"] for lv in t["levels"])
        p50s = sorted(p for lv in levels if (p := _dist(lv, "connect_ms", "p50")) is not None)
        connect = "" if not p50s else f", connect p50 {p50s[0]:.2f} ms" if len(p50s) == 1 or p50s[0] == p50s[-1] \
            else f", connect p50 {p50s[0]:.2f}–{p50s[-1]:.2f} ms"
        out.append(f"{t['label']}: {opened:,} of {sent:,} requests opened a connection{connect} (in their latency)")
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


def prefill_table(doc: dict[str, Any]) -> Grid:
    """Per prompt length × target: prompt_n, prompt_ms, prompt tok/s, client TTFT; the first two
    targets' prefill speed ratio."""
    targets = [t for t in doc["targets"] if t.get("prefill")]
    pair = targets[:2] if len(targets) >= 2 else []
    columns = [Column("prompt\ntokens", key=True), Column("target", "left", key=True), Column("ok/failed"),
               Column("prompt_n"), Column("prompt_ms"), Column("prompt tok/s"), Column("TTFT ms\n(client)")]
    if pair:
        columns.append(Column("prompt tok/s\nratio"))
    grid = Grid(_title("prefill", doc), [*columns, Column("note", "left")],
                caption=f"prompt tok/s ratio: {pair[0]['label']} ÷ {pair[1]['label']}" if pair else None)
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
            cells: list[Cell] = [Num(n) if first else "", t["label"], _okf(r), count, _pm(r["prompt_ms"], 0),
                                 _pm(r["prompt_tok_s"], 1), _pm(r["ttft_ms"], 0)]
            if pair:
                speed = [(rows.get(p["label"]) or {}).get("prompt_tok_s") for p in pair]
                cells.append(_ratio(speed[0]["mean"], speed[1]["mean"]) if first and all(speed) else "")
            note = r.get("skipped") or r.get("note")
            cells.append(grid.footnote(f"{t['label']} at {n:,} tokens: {note}") if note else "")
            grid.add_row(*cells)
            first = False
        grid.end_section()
    return grid


def depth_table(doc: dict[str, Any]) -> Grid:
    """Per target × depth: decode tok/s and its change against depth 0; skipped depths say why."""
    grid = Grid(_title("depth", doc), [
        Column("target", "left", key=True), Column("depth", key=True), Column("ok/failed"), Column("prompt_n"),
        Column("decode tok/s"), Column("vs depth 0"), Column("note", "left")])
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
            note = r.get("skipped") or r.get("note")
            mark = grid.footnote(f"{t['label']} at depth {r['depth']:,}: {note}") if note else ""
            if r.get("skipped"):
                cells: list[Cell] = [t["label"] if i == 0 else "", Num(r["depth"]), "—", "—", "—", "—", mark]
            else:
                cells = [t["label"] if i == 0 else "", Num(r["depth"]), _okf(r), _pm(r["prompt_n"], 0),
                         _pm(r["decode_tok_s"], 2), change_text, mark]
            grid.add_row(*cells, end_section=i == len(section["rows"]) - 1)
    return grid


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


_DRIFT = {True: "more than noise", False: "within noise", None: "too few windows to test"}


def soak_table(doc: dict[str, Any]) -> Grid:
    """Per target: requests, errors by kind, the load offered, throughput, error-free time and drift."""
    grid = Grid(_title("soak", doc), [
        Column("target", "left", key=True), Column("duration"), Column("ok/failed"),
        Column("offered\nreq/s"), Column("tok/s"), Column("error-free"), Column("longest\nerror-free"),
        Column("first → last\nwindow tok/s"), Column("drift"), Column("errors", "left", wrap=True)])
    for t in doc["targets"]:
        s = t.get("soak")
        if not s:
            continue
        errors = ", ".join(f"{k} ×{n}" for k, n in s["errors_by_kind"].items()) or "none"
        failed = s["requests_failed"]
        drift = "n/a (too short)" if s["drift"] is None else f"{s['drift']:+.1%} ({_DRIFT[s['drift_significant']]})"
        first, last = s["first_throughput_tok_s"], s["last_throughput_tok_s"]
        grid.add_row(t["label"], _hours(s["duration_s"]), _okf(s),
                     Num(s.get("offered_req_s"), 2), Num(s["throughput_tok_s"], 2),  # offered: None in older files
                     f"{_hours(s['error_free_s'])} of {_hours(s['duration_s'])}", _hours(s["longest_error_free_s"]),
                     "n/a" if first is None else f"{first:,.1f} → {last:,.1f}", drift,
                     Text(errors, style="red" if failed else ""))
    return grid


def run_grids(doc: dict[str, Any]) -> list[Grid]:
    """Every table of a run document: a sweep's three, or the table of a prefill, depth or soak run."""
    kind = doc.get("kind")
    if kind in _MODE_TABLES:
        return [_MODE_TABLES[kind](doc)]
    tables = [sweep_table(doc)] if any(t.get("levels") for t in doc["targets"]) else []
    return tables + [g for g in (latency_table(doc), queue_table(doc), workload_table(doc), cache_table(doc))
                     if g is not None]


_MODE_TABLES = {"prefill": prefill_table, "depth": depth_table, "soak": soak_table}


def run_lines(doc: dict[str, Any], told: bool = False) -> dict[str, list[str]]:
    """The lines that go with a run's tables: notes, verdicts (both for stdout), warnings and errors."""
    notes = overhead_lines(doc) + connection_lines(doc)
    sections = [t.get(doc.get("kind")) for t in doc["targets"] if doc.get("kind") in ("prefill", "depth")]
    if any("per-slot n_ctx" in (r.get("skipped") or "") for s in sections if s for r in s["rows"]):
        notes.append(SKIP_HINT)
    return {"notes": notes, "verdicts": verdict_lines(doc), "warnings": killed_lines(doc) + reach_lines(doc) + worker_death_lines(doc),
            "errors": error_lines(doc, told)}


def print_run(doc: dict[str, Any], console: Console, err: Console, output_format: str = "table", *,
              live: bool = False) -> None:
    """The tables and lines of a run document, the same after a run (`live`) and from `analyze`: drawn
    for the terminal (`table`), or as JSON, CSV or Markdown on stdout, which then holds nothing else."""
    grids, lines = run_grids(doc), run_lines(doc, told=live)
    said = lines["notes"] + lines["verdicts"]
    if output_format == "json":
        console.file.write(grids_json(grids, lines))
    elif output_format == "csv":
        console.file.write(grids_csv(grids))
    elif output_format == "markdown":
        console.file.write(grids_markdown(grids, said))
    else:
        for grid in grids:
            print_grid(grid, console)
        for line in lines["notes"]:
            say(console, line, "dim")
        for line in lines["verdicts"]:
            say(console, line)
    if output_format == "csv":
        for line in said:
            say(err, line)
    for line in lines["warnings"]:
        say(err, line, "yellow")
    for line in lines["errors"]:
        say(err, line, "red")


def say(console: Console, line: str, style: str | None = None) -> None:
    """One message: wrapped between words on a terminal, one line in a file or pipe (for grep)."""
    console.print(line, style=style, highlight=False, markup=False, soft_wrap=not console.is_terminal)

