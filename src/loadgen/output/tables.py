"""Terminal rendering of a run document (run.json's content, typed: core/rundoc.py). Reads data,
computes nothing new."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.text import Text

from ..analysis import metric_defs
from ..analysis.depth import SKIP_HINT
from ..analysis.speculation import level_acceptance_text
from ..core.records import RequestRecord, level_name, level_short
from ..core.rundoc import (
    KILLED_DURING_LEVEL,
    Distribution,
    Level,
    LevelVerdict,
    MeanSd,
    RunDocument,
    SloJudgement,
    SoakAttainment,
    Target,
)
from ..run.labels import about
from .cache import cache_table, turn_tables
from .environment import energy_lines, environment_change_lines, shown_net, soak_window_lines
from .kind_view import rows_section, view_of
from .layout import Cell, Column, Grid, Num, grids_csv, grids_json, grids_markdown, print_table
from .lora import lora_table
from .workload import workload_table

Doc = RunDocument | dict[str, Any]  # run.json's content, typed (core/rundoc.py) or as read


def _dist(level: Level, m: metric_defs.Metric, stat: str) -> float | None:
    d = level_distribution(level, m)
    return None if d is None else getattr(d, stat)


def _ratio(a: float | None, b: float | None) -> Num:
    return Num(None if a is None or b is None or b <= 0 else a / b, 2, "×")


def chosen_percentiles(doc: RunDocument) -> list[str]:
    """--percentiles: the names of the run's chosen percentiles ("p95", ...), or [] (the fixed columns)."""
    chosen = doc.config.percentiles if doc.config is not None else None
    return [metric_defs.percentile_label(q) for q in chosen or ()]


def _chosen(level: Level, m: metric_defs.Metric, label: str) -> float | None:
    """A level's chosen percentile of a metric (--percentiles), or None."""
    return ((level.percentiles or {}).get(m.key) or {}).get(label)


def _level_name(doc: RunDocument, level: int | float) -> str:
    return level_name(level, doc.open_loop)


def sweep_table(doc: Doc) -> Grid:
    """One row per level × target, levels grouped; the last column compares the first two targets."""
    doc = RunDocument.of(doc)
    targets = doc.targets
    pair = [t for t in targets if t.levels][:2]
    open_loop = doc.open_loop
    chosen = chosen_percentiles(doc)  # --percentiles: they replace the fixed p50, p99, max
    # open loop: the rate the requests actually left at beside the nominal one (n/a in older files)
    columns = [Column("req/s" if open_loop else "C", key=True), Column("target", "left", key=True),
               *([Column("achieved\nreq/s")] if open_loop else []), Column("ok/failed"), Column("tok/s"),
               Column("latency ms\nmean"), *[Column(label) for label in chosen or ("p50", "p99", "max")],
               Column("queue wait\nms mean"), Column("decode tok/s\nper req"), Column("out tok"), Column("wall s"),
               Column("predicted_ms\nmean"), Column("ok\nreq/s"), Column("in tok"), Column("total\ntok/s")]
    caption = None
    optional = _optional_columns(targets)
    columns += [c for group, _ in optional for c in group]
    if len(pair) == 2:
        columns.insert(5 if open_loop else 4, Column("tok/s\nratio"))
        caption = f"tok/s ratio: {pair[0].label} ÷ {pair[1].label}"
    grid = Grid(_title(_sweep_command(doc), doc), columns, caption=caption)
    levels = sorted({lv.level for t in targets for lv in t.levels})
    # A level run more than once (loadgen capacity repeats one near the line) gets a row per run.
    runs = [(c, k) for c in levels for k in range(max(sum(lv.level == c for lv in t.levels) for t in targets))]
    for c, k in runs:
        by_target = {t.label: next(iter([lv for lv in t.levels if lv.level == c][k:k + 1]), None) for t in targets}
        first = True
        for t in targets:
            lv = by_target[t.label]
            if lv is None:
                continue
            row: list[Cell] = [Num(c, None) if first else "", _who(t.label, lv),
                               *([Num(lv.achieved_rate, 2)] if open_loop else []), _okf(lv.requests_ok, lv.requests_failed),
                               Num(lv.throughput_tok_s, 2)]
            if caption:
                both = [by_target.get(p.label) for p in pair]
                row.append(_ratio(*(x.throughput_tok_s for x in both if x)) if first and all(both) else "")
            row += _latency_cells(lv, chosen)
            row += [Num(_dist(lv, metric_defs.QUEUE_WAIT, "mean")), Num(lv.decode_tok_s_mean, 1),
                    Num(lv.output_tokens), Num(lv.wall_s, 2), Num(lv.predicted_ms_mean),
                    Num(lv.request_rate, 2), Num(lv.input_tokens), Num(lv.total_tok_s, 1)]
            for _, cells in optional:
                row += cells(t, lv)
            grid.add_row(*row)
            first = False
        grid.end_section()
    return grid


def _optional_columns(targets: Sequence[Target]) -> list[tuple[list[Column], Callable[[Target, Level], list[Cell]]]]:
    """The sweep table's column groups shown only when a level has their figures, each with its cells
    of a level, in table order."""
    levels = [lv for t in targets for lv in t.levels]
    groups: list[tuple[list[Column], Callable[[Target, Level], list[Cell]]]] = []
    if any(lv.texts_per_s is not None for lv in levels):  # --api embeddings, rerank: texts answered, no output
        groups.append(([Column("texts/s"), Column("prompt\ntok/s")],
                       lambda t, lv: [Num(lv.texts_per_s, 1), Num(lv.input_tok_s, 1)]))
    if any(lv.slo for lv in levels):  # --slo: each level's attainment and goodput (analysis/slo.py)
        groups.append(([Column("attain"), Column("goodput\nreq/s"), Column("goodput\ntok/s"), Column("most\nmissed")],
                       lambda t, lv: _slo_cells(lv.slo_judgement)))
    # Speculative decoding: shown when any level drafted or any server said it speculates (a level
    # that did not draft says "no speculation", or 0% on a server that speculates).
    if any(lv.draft_n is not None for lv in levels) or any(_speculates(t) for t in targets):
        groups.append(([Column("draft\naccepted"), Column("drafted\nper out tok")], _drafting_cells))
    if any(lv.reasoning_tokens is not None for lv in levels):  # any level's requests thought before answering
        groups.append(([Column("reasoning\nshare"), Column("first answer\nms p50")], lambda t, lv: _reasoning_cells(lv)))
    # The machine (--environment): energy when any level has counters, a mark where it changed.
    if any(lv.energy for lv in levels):
        groups.append((ENERGY_COLUMNS, lambda t, lv: _energy_cells(lv)))
    if any(lv.machine_changed for lv in levels):
        groups.append(([Column("machine")], lambda t, lv: [_changed_cell(lv)]))
    return groups


ENERGY_COLUMNS = [Column("J/token"), Column("net\nJ/token"), Column("mean W")]


def _energy_cells(lv: Level) -> list[Cell]:
    """A level's gross and net J per output token and its mean power (core/rundoc.py `headline_energy`:
    the "total" source, else the only one; the lines under the table give each source)."""
    e = lv.headline_energy
    if e is None:
        return [Num(None), Num(None), Num(None)]
    net = shown_net(e.net_j_per_token)  # a net at or below zero is idle noise, not a figure
    return [Num(e.j_per_token, 3), net if isinstance(net, str) else Num(net, 3), Num(e.mean_w, 1)]


def _changed_cell(lv: Level) -> Cell:
    """"changed" for a level whose machine changed during it (the warnings below say what); n/a for
    a level the machine was not sampled through."""
    if lv.environment_changed is None:
        return "n/a"
    return Text("changed", style="yellow") if lv.machine_changed else ""


def _speculates(t: Target) -> bool | None:
    """Whether the target's server said (its /slots) that it speculates; None: it did not say."""
    return None if t.server is None else t.server.speculative


def _drafting_cells(t: Target, lv: Level) -> list[Cell]:
    """A level's acceptance ("no speculation", or 0% on a server that speculates and drafted nothing)
    and drafted tokens per output token."""
    spec = _speculates(t)
    return [level_acceptance_text(spec, lv.draft_n, lv.draft_n_accepted),
            Num(0.0 if spec and not lv.draft_n else lv.drafted_per_output_token, 2)]


def _latency_cells(lv: Level, chosen: list[str]) -> list[Cell]:
    """A level's latency mean and p50/p99/max, or its --percentiles instead of the three."""
    spread = [Num(_chosen(lv, metric_defs.LATENCY, label)) for label in chosen] if chosen else \
        [Num(_dist(lv, metric_defs.LATENCY, stat)) for stat in ("p50", "p99", "max")]
    return [Num(_dist(lv, metric_defs.LATENCY, "mean")), *spread]


def _reasoning_cells(lv: Level) -> list[Cell]:
    """A level's reasoning share ("none" when no request reasoned) and time to the first answer p50."""
    share = lv.reasoning_share
    return ["none" if share is None else f"{share * 100:.0f}%", Num(_dist(lv, metric_defs.TTFA, "p50"))]


def _slo_cells(slo: SloJudgement | None) -> list[Cell]:
    if slo is None:
        return ["", "", "", ""]
    shown = "n/a" if slo.attainment is None else f"{slo.attainment:.0%}"
    return [Text(shown, style="green" if slo.passed else "red"), Num(slo.goodput_req_s, 2),
            Num(slo.goodput_tok_s, 1), slo.most_missed or ""]


def slo_lines(doc: Doc) -> list[str]:
    """What the attainment columns judge against: the run's latency targets and required share."""
    config = RunDocument.of(doc).config
    slo = None if config is None else config.slo_targets
    if slo is None or not slo.targets_ms:
        return []
    targets = ", ".join(f"{name}≤{ms / 1000:g} s" if ms >= 1000 else f"{name}≤{ms:g} ms"
                        for name, ms in slo.targets_ms.items())
    return [f"SLO: {targets}; a level passes when at least {slo.attainment:.0%} of its requests meet every "
            "target (errors always miss); goodput counts only those requests."]


def trim_lines(doc: Doc) -> list[str]:
    """--trim: what each level's figures left out (analysis/trim.py), one line per target."""
    doc = RunDocument.of(doc)
    trim = doc.config.trim if doc.config is not None else None
    if trim is None:
        return []
    out = []
    for t in doc.targets:
        parts = []
        for lv in t.levels:
            cut = lv.trimmed
            if cut is None:
                continue
            said = "too short, not trimmed" if cut.too_short else f"{cut.head} + {cut.tail} left out ({cut.cut_s:.3g} s at each end)"
            parts.append(f"{level_short(lv.level, doc.open_loop)} {said}")
        if parts:
            out.append(f"--trim {trim}: {t.label}'s figures leave out the requests started in the first and last "
                       f"{trim} of each level (records kept): {'; '.join(parts)}")
    return out


def error_lines(doc: Doc, told: bool = False) -> list[str]:
    """One line per target or level that had failures, naming the error kinds. `told`: the run
    itself said already why a target never started (right after the run; `analyze` says it)."""
    doc = RunDocument.of(doc)
    lines = []
    for t in doc.targets:
        # what the run told as it happened: a target that never answered (no server facts), skipped
        unanswered = t.server is None and not (t.levels or t.prefill or t.depth or t.soak)
        if t.error and not (told and unanswered):
            lines.append(about(t.label, t.error))
        for lv in t.levels:
            if lv.errors_by_kind:
                kinds = ", ".join(f"{k} ×{n}" for k, n in lv.errors_by_kind.items())
                lines.append(f"{t.label} at {_level_name(doc, lv.level)}: {kinds}")
    return lines


def reach_lines(doc: Doc) -> list[str]:
    """One warning per closed-loop level that ran to its end without ever having its concurrency in
    flight (a duration shorter than a request, or a stagger longer than one); a level its target
    ended early says so elsewhere."""
    doc = RunDocument.of(doc)
    if doc.open_loop:
        return []
    lines = []
    for t in doc.targets:
        for lv in t.levels:
            reached = lv.concurrency_reached
            if reached is None or reached >= lv.concurrency or lv.stopped_reason:
                continue
            lines.append(f"warning: {t.label} at {_level_name(doc, lv.level)}: at most {reached} "
                         f"request{' was' if reached == 1 else 's were'} in flight, so that level's figures are not "
                         f"those of concurrency {lv.concurrency}")
    return lines


def worker_death_lines(doc: Doc) -> list[str]:
    """One warning per --workers process that died mid-level: when, the requests it lost, and the
    load the level offered from then on (run.json's per-level "workers")."""
    doc = RunDocument.of(doc)
    lines = []
    for t in doc.targets:
        for lv in t.levels:
            for w in lv.workers or []:
                if w.died_at_s is None:
                    continue
                if w.rate_after is not None:
                    after = f"at {w.rate_after:g} of {lv.level:g} req/s"
                else:
                    after = f"at concurrency {w.concurrency_after} of {lv.concurrency}"
                lines.append(f"warning: {t.label} at {_level_name(doc, lv.level)}: worker {w.worker} died "
                             f"at {w.died_at_s:.1f} s ({w.stopped_reason}): the level ran {after} from "
                             f"then on; {w.lost} request{'' if w.lost == 1 else 's'} in flight recorded as lost")
    return lines


def killed_lines(doc: Doc) -> list[str]:
    """One warning per level summarised from its records because the run was killed while it ran
    (results/unfinished.py): its figures are those of the requests recorded before the kill."""
    doc = RunDocument.of(doc)
    lines = []
    for t in doc.targets:
        for lv in t.levels:
            if lv.stopped_reason == KILLED_DURING_LEVEL:
                n = lv.requests_ok + lv.requests_failed + lv.requests_cancelled + lv.requests_lost
                lines.append(f"warning: {t.label} {level_short(lv.level, doc.open_loop)}: incomplete, the run "
                             f"was killed during this level; {n} request{'' if n == 1 else 's'} recorded")
    return lines


def stopped_lines(doc: Doc) -> list[str]:
    """One warning per level stopped before its end (Ctrl-C, SIGTERM, a target that went down) whose
    requests did not all complete: what became of them, so its figures are read for what they are
    (in open loop the schedule's count: ok + failed + cancelled + not sent = scheduled)."""
    doc = RunDocument.of(doc)
    lines = []
    for t in doc.targets:
        for lv in t.levels:
            if not lv.stopped_reason or lv.stopped_reason == KILLED_DURING_LEVEL:
                continue
            parts = []
            if lv.requests_cancelled:
                parts.append(f"{lv.requests_cancelled} in flight cancelled")
            if lv.requests_not_sent:
                parts.append(f"{lv.requests_not_sent} of {lv.requests_scheduled} scheduled not sent")
            if parts:
                lines.append(f"warning: {t.label} {level_short(lv.level, doc.open_loop)}: stopped "
                             f"({lv.stopped_reason}) after {lv.requests_ok} answers; " + ", ".join(parts)
                             + "; its figures are those of the answered requests")
    return lines


def queue_table(doc: Doc) -> Grid | None:
    """Per target and level: queued requests, queue wait, the deferred queue, busy slots, gain.

    The queue wait shown is the level's `queue_wait_ms` (metrics.queue_wait_ms, raw: not corrected
    for the c=1 overhead), the same figure the sweep table, the HTML and Markdown reports and the CSV
    show under that name; the overhead correction only decides which requests count as queued. Of
    the queued, "for a slot" waited while every slot was busy, and "held outside" waited with a slot
    free (analysis/occupancy.py), the longest such wait beside them: neither is judged by a scrape
    (n/a where the records cannot tell: no slot count or no timings)."""
    doc = RunDocument.of(doc)
    rows = [(t, t.verdict, lv) for t in doc.targets if t.verdict for lv in t.verdict.levels]
    if not rows:
        return None
    grid = Grid("queuing and saturation", [
        Column("target", "left", key=True), Column("req/s" if doc.open_loop else "C", key=True),
        Column("queued"), Column("for a\nslot"), Column("held\noutside"), Column("outside\nmax ms"),
        Column("queue wait\nms p50"), Column("p99"), Column("max"), Column("peak\ndeferred"),
        Column("peak busy\nslots"), Column("slots"), Column("batching\ngain")])
    last = None
    for t, verdict, lv in rows:
        summary = t.level(lv.level)
        qw = None if summary is None else summary.queue_wait_ms
        grid.add_row(t.label if t.label != last else "", Num(lv.level, None),
                     f"{lv.queued}/{lv.requests} ({lv.queued_share:.0%})",
                     *_held(lv), *(Num(None if qw is None else getattr(qw, k)) for k in ("p50", "p99", "max")),
                     Num(lv.peak_deferred), Num(lv.peak_busy_slots), Num(verdict.total_slots),
                     Num(lv.batching_gain, 2, "×"))
        last = t.label
    return grid


def _held(lv: LevelVerdict) -> list[Any]:
    """A level's queued requests by cause (records-based only: a verdict written before has none)."""
    if lv.evidence != "records":
        return [Num(None), Num(None), Num(None)]
    return [Num(lv.slot_queued), Num(lv.held_outside), Num(lv.held_outside_max_ms if lv.held_outside else None)]


def _detail_columns(chosen: Sequence[str] = ()) -> list[tuple[str, metric_defs.Metric, str]]:
    """(column title, metric, statistic) of the latency detail table: every metric's `table`
    columns (analysis/metric_defs.py), in their table order; with `chosen` percentiles
    (--percentiles), those of metric_defs.PERCENTILE_METRICS instead of their own columns."""
    ordered = sorted(metric_defs.all_metrics(), key=lambda m: m.table_order)
    out = []
    for m in ordered:
        if chosen and m in metric_defs.PERCENTILE_METRICS:
            out += [(f"{m.short} ms\n{label}", m, label) for label in chosen]
        else:
            out += [(title, m, stat) for title, stat in m.table]
    return out


def level_distribution(level: Level, m: metric_defs.Metric) -> Distribution | None:
    """A level's distribution of a metric: its own field of the level summary, or its entry under
    "metrics" (a metric registered beyond the built-in ones)."""
    d = getattr(level, m.key, None) if m.name in metric_defs.BUILT_IN else level.metrics.get(m.name)
    return d if isinstance(d, Distribution) else None


def latency_table(doc: Doc) -> Grid | None:
    """Streaming and open-loop latencies (TTFT, TPOT, ITL, corrected vs uncorrected E2E, send lag),
    and every other metric that names table columns."""
    doc = RunDocument.of(doc)
    rows = [(t, lv) for t in doc.targets for lv in t.levels]
    chosen = chosen_percentiles(doc)
    columns = [c for c in _detail_columns(chosen) if any(level_distribution(lv, c[1]) for _, lv in rows)]
    if not any(m is not metric_defs.LATENCY for _, m, _ in columns):
        return None
    grid = Grid("latency detail (ms)", [Column("target", "left", key=True),
                                        Column("req/s" if doc.open_loop else "C", key=True),
                                        *[Column(title) for title, _, _ in columns]])
    last = None
    for t, lv in rows:
        who = _who(t.label, lv)
        grid.add_row(who if who != last else "", Num(lv.level, None),
                     *[Num(_chosen(lv, m, stat) if chosen and m in metric_defs.PERCENTILE_METRICS else _dist(lv, m, stat),
                           m.table_digits)
                       for _, m, stat in columns])
        last = who
    return grid


def _who(label: str, lv: Level) -> str:
    """A row's target; in a run of request classes, with the level's class and phase ("sim chat alone")."""
    return label if lv.request_class is None else f"{label} {lv.request_class} {lv.phase}"


def verdict_lines(doc: Doc) -> list[str]:
    """Each target's saturation verdict; in a run of request classes, how each class fared beside
    the others (analysis/interference.py)."""
    targets = RunDocument.of(doc).targets
    return [line for t in targets if t.verdict for line in t.verdict.verdict] + [
        f"{t.label}: {v.line}" for t in targets for v in t.interference or []]


def answer_lines(doc: Doc) -> list[str]:
    """One line per target whose answers stopped short of what was asked (run.json per level
    `answers_cut`, `answers_short`; analysis/cut_answers.py): cut by the server's context, always;
    short for another reason, only under --ignore-eos (else the model may stop, as asked)."""
    doc = RunDocument.of(doc)
    ignore_eos = doc.config is not None and bool(doc.config.ignore_eos)
    out = []
    for t in doc.targets:
        cut = [(lv, lv.answers_cut) for lv in t.levels if lv.answers_cut]
        if cut:
            total = sum(n for _, n in cut)
            where = ", ".join(f"{n:,} at {level_short(lv.level, doc.open_loop)}" for lv, n in cut)
            out.append(f"{t.label}: {total:,} answers cut by the context ({where}): the server stopped them on its "
                       "length limit with fewer tokens than asked (answers_cut); their figures are not those of "
                       "the answer asked for: restart the server with a larger -c, or ask for fewer tokens")
        short = [(lv, lv.answers_short) for lv in t.levels if lv.answers_short]
        if ignore_eos and short:
            total = sum(n for _, n in short)
            where = ", ".join(f"{n:,} at {level_short(lv.level, doc.open_loop)}" for lv, n in short)
            out.append(f"warning: {t.label}: {total:,} answers shorter than asked under --ignore-eos ({where}; "
                       "answers_short): the server stopped them before their length")
    return out


def length_lines(doc: Doc) -> list[str]:
    """One line per target whose prompt lengths loadgen had to change (run.json `lengths_changed`)."""
    out = []
    for t in RunDocument.of(doc).targets:
        changed = t.lengths_changed
        if changed is not None and changed.floored:
            out.append(f"{t.label}: {changed.floored:,} of {changed.requests:,} prompts floored to "
                       f"{changed.floor_tokens} tokens, the shortest that holds the salt on this server "
                       "(their asked length is each record's prompt_tokens_target)")
    return out


def overhead_lines(doc: Doc) -> list[str]:
    out = []
    document = RunDocument.of(doc)
    # --models: a request sent to an unloaded model waits for its load before the server starts it
    what = ("HTTP, tokenization and model loads (--models: see the router table)"
            if document.config is not None and document.config.models is not None else "HTTP and tokenization")
    for t in document.targets:
        if t.verdict and t.verdict.overhead_ms is not None:
            out.append(f"{t.label}: {t.verdict.overhead_ms:.1f} ms of {what} at c=1, not counted as queuing")
    return out


def connection_lines(doc: Doc) -> list[str]:
    """One line per target whose requests opened connections inside a level's clock: how many, and
    what connecting took them (part of their latency; per level in run.json). loadgen opens a
    level's connections before its clock starts, so these are the server's doing: one that closes
    after every response (llama-server after a stream), or one that closed idle ones."""
    out = []
    for t in RunDocument.of(doc).targets:
        levels = [lv for lv in t.levels if lv.connections_opened]
        if not levels:
            continue
        opened = sum(lv.connections_opened or 0 for lv in levels)
        sent = sum(lv.requests_ok + lv.requests_failed for lv in t.levels)
        p50s = sorted(p for lv in levels if (p := _dist(lv, metric_defs.CONNECT, "p50")) is not None)
        connect = "" if not p50s else f", connect p50 {p50s[0]:.2f} ms" if len(p50s) == 1 or p50s[0] == p50s[-1] \
            else f", connect p50 {p50s[0]:.2f}–{p50s[-1]:.2f} ms"
        out.append(f"{t.label}: {opened:,} of {sent:,} requests opened a connection{connect} (in their latency)")
    return out


def _pm(stat: MeanSd | None, digits: int = 1) -> str:
    """mean ± sd, or n/a."""
    return "n/a" if stat is None else stat.text(digits)


def _okf(ok: int, failed: int) -> Text:
    return Text(f"{ok}/{failed}", style="red" if failed else "")


def _sweep_command(doc: RunDocument) -> str:
    """The command that wrote a sweep-kind run: a cache mode's own (prefix, chat), else sweep."""
    cache = doc.config.cache_mode if doc.config is not None else None
    return {"shared_prefix": "prefix", "multi_turn": "chat"}.get(cache.kind or "", "sweep") if cache else "sweep"


def _title(kind: str, doc: RunDocument) -> str:
    return f"loadgen {kind}" + ("" if doc.complete else "  [incomplete]")


def prefill_table(doc: Doc) -> Grid:
    """Per prompt length × target: prompt_n, prompt_ms, prompt tok/s, client TTFT; the first two
    targets' prefill speed ratio."""
    doc = RunDocument.of(doc)
    targets = [(t.label, t.prefill) for t in doc.targets if t.prefill]
    pair = targets[:2] if len(targets) >= 2 else []
    columns = [Column("prompt\ntokens", key=True), Column("target", "left", key=True), Column("ok/failed"),
               Column("prompt_n"), Column("prompt_ms"), Column("prompt tok/s"), Column("TTFT ms\n(client)")]
    if pair:
        columns.append(Column("prompt tok/s\nratio"))
    grid = Grid(_title("prefill", doc), [*columns, Column("note", "left")],
                caption=f"prompt tok/s ratio: {pair[0][0]} ÷ {pair[1][0]}" if pair else None)
    lengths = sorted({r.prompt_tokens for _, section in targets for r in section.rows})
    for n in lengths:
        rows = {label: next((r for r in section.rows if r.prompt_tokens == n), None) for label, section in targets}
        first = True
        for label, _ in targets:
            r = rows[label]
            if r is None:
                continue
            count = "n/a" if not r.prompt_n else (f"{r.prompt_n_min:,}" if r.prompt_n_min == r.prompt_n_max
                                                 else f"{r.prompt_n_min:,}-{r.prompt_n_max:,}")
            cells: list[Cell] = [Num(n) if first else "", label, _okf(r.requests_ok, r.requests_failed), count,
                                 _pm(r.prompt_ms, 0), _pm(r.prompt_tok_s, 1), _pm(r.ttft_ms, 0)]
            if pair:
                speed = [x.prompt_tok_s if (x := rows.get(p)) else None for p, _ in pair]
                cells.append(_ratio(speed[0].mean, speed[1].mean) if first and speed[0] and speed[1] else "")
            note = r.skipped or r.note
            cells.append(grid.footnote(f"{label} at {n:,} tokens: {note}") if note else "")
            grid.add_row(*cells)
            first = False
        grid.end_section()
    return grid


def depth_table(doc: Doc) -> Grid:
    """Per target × depth: decode tok/s and its change against depth 0; skipped depths say why."""
    doc = RunDocument.of(doc)
    grid = Grid(_title("depth", doc), [
        Column("target", "left", key=True), Column("depth", key=True), Column("ok/failed"), Column("prompt_n"),
        Column("decode tok/s"), Column("vs depth 0"), Column("note", "left")])
    for t in doc.targets:
        if not t.depth:
            continue
        section = t.depth.rows
        for i, r in enumerate(section):
            ref, change = r.reference_depth, r.change
            change_text = "n/a" if change is None else ("—" if r.depth == ref else f"{change:+.1%}")
            if change is not None and ref not in (0, None) and r.depth != ref:
                change_text += f" (vs {ref:,})"
            note = r.skipped or r.note
            mark = grid.footnote(f"{t.label} at depth {r.depth:,}: {note}") if note else ""
            if r.skipped:
                cells: list[Cell] = [t.label if i == 0 else "", Num(r.depth), "—", "—", "—", "—", mark]
            else:
                cells = [t.label if i == 0 else "", Num(r.depth), _okf(r.requests_ok, r.requests_failed),
                         _pm(r.prompt_n, 0), _pm(r.decode_tok_s, 2), change_text, mark]
            grid.add_row(*cells, end_section=i == len(section) - 1)
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


def soak_table(doc: Doc) -> Grid:
    """Per target: requests, errors by kind, the load offered, throughput, error-free time and drift;
    with --slo also the attainment and goodput over the soak, and the attainment's drift; when the
    machine was sampled, the windows it changed during (the drift says so when it compares one)."""
    doc = RunDocument.of(doc)
    judged = any(t.soak is not None and t.soak.slo is not None for t in doc.targets)
    sampled = any(w.environment_changed is not None for t in doc.targets if t.soak for w in t.soak.windows)
    slo_columns = [Column("attain\n(--slo)"), Column("goodput\nreq/s"), Column("first → last\nattain")]
    grid = Grid(_title("soak", doc), [
        Column("target", "left", key=True), Column("duration"), Column("ok/failed"),
        Column("offered\nreq/s"), Column("tok/s"), Column("error-free"), Column("longest\nerror-free"),
        Column("first → last\nwindow tok/s"), Column("drift"), *slo_columns * judged,
        *[Column("machine changed\n(windows)")] * sampled,
        Column("errors", "left", wrap=True)])
    for t in doc.targets:
        s = t.soak
        if not s:
            continue
        errors = ", ".join(f"{k} ×{n}" for k, n in s.errors_by_kind.items()) or "none"
        drift = "n/a (too short)" if s.drift is None else f"{s.drift:+.1%} ({_DRIFT[s.drift_significant]})"
        spoiled = sorted(n for n, _ in s.changed_windows() if n in s.drift_compared())
        if spoiled and s.drift is not None:  # the first or last windows ran on a machine that changed
            drift += f"; machine changed in window {', '.join(map(str, spoiled))}"
        first, last = s.first_throughput_tok_s, s.last_throughput_tok_s
        grid.add_row(t.label, _hours(s.duration_s), _okf(s.requests_ok, s.requests_failed),
                     Num(s.offered_req_s, 2), Num(s.throughput_tok_s, 2),  # offered: None in older files
                     f"{_hours(s.error_free_s)} of {_hours(s.duration_s)}", _hours(s.longest_error_free_s),
                     "n/a" if first is None else f"{first:,.1f} → {last:,.1f}", drift,
                     *(_soak_slo_cells(s.slo) if judged else []),
                     *([", ".join(str(n) for n, _ in s.changed_windows()) or "none"] if sampled else []),
                     Text(errors, style="red" if s.requests_failed else ""))
    return grid


_FALLING = {True: "falling", False: "within noise", None: "too few to test"}


def soak_attainment_lines(doc: Doc) -> list[str]:
    """A warning per soak whose SLO attainment fell beyond noise between its first and last windows
    (analysis/soak.py `attainment_falling`)."""
    out = []
    for t in RunDocument.of(doc).targets:
        slo = t.soak.slo if t.soak is not None else None
        if slo is None or not slo.falling or slo.first_attainment is None or slo.last_attainment is None:
            continue
        k = t.soak.drift_windows if t.soak is not None else None
        p = "" if slo.falling_p is None else f", Fisher p={slo.falling_p:.2g}"
        out.append(f"{t.label}: SLO attainment fell from {slo.first_attainment:.0%} to {slo.last_attainment:.0%} "
                   f"between the first and last {k or ''} window(s), more than noise{p}")
    return out


def _soak_slo_cells(slo: SoakAttainment | None) -> list[Any]:
    """A soak's attainment ("✗" below --attainment), goodput, and its first → last attainment with
    whether it is falling (analysis/soak.py `attainment_falling`)."""
    if slo is None:
        return ["–", "–", "–"]
    attained = "–" if slo.attainment is None else f"{slo.attainment:.0%}{'' if slo.passed else ' ✗'}"
    first, last = slo.first_attainment, slo.last_attainment
    drift = ("n/a" if first is None or last is None
             else Text(f"{first:.0%} → {last:.0%} ({_FALLING[slo.falling]})", style="red" if slo.falling else ""))
    return [Text(attained, style="" if slo.passed else "red"), Num(slo.goodput_req_s, 2), drift]


def run_grids(doc: Doc, records: Sequence[RequestRecord] | None = None) -> list[Grid]:
    """Every table of a run document: a sweep's three, or the table of a prefill, depth or soak run;
    given the run's records, a multi-turn run's per-turn tables too (output/cache.py `turn_tables`)."""
    doc = RunDocument.of(doc)
    table = view_of(doc).draw_table(doc)
    if table is not None:
        return [table]
    tables = [sweep_table(doc)] if any(t.levels for t in doc.targets) else []
    return tables + [g for g in (latency_table(doc), queue_table(doc), workload_table(doc), cache_table(doc),
                                 lora_table(doc, records or [])) if g is not None] + turn_tables(doc, records or [])


@dataclass(frozen=True, slots=True)
class RunLines:
    """The lines that go with a run's tables, by kind: notes and verdicts (stdout), warnings and errors."""

    notes: list[str]
    verdicts: list[str]
    warnings: list[str]
    errors: list[str]

    def to_dict(self) -> dict[str, list[str]]:
        return asdict(self)


def run_lines(doc: Doc, told: bool = False) -> RunLines:
    """The lines that go with a run's tables: notes, verdicts (both for stdout), warnings and errors."""
    doc = RunDocument.of(doc)
    notes = (slo_lines(doc) + trim_lines(doc) + length_lines(doc) + answer_lines(doc) + overhead_lines(doc)
             + connection_lines(doc))
    sections = [t.section(doc.kind) for t in doc.targets] if rows_section(doc) else []
    if any("per-slot n_ctx" in (getattr(r, "skipped", None) or "") for s in sections if s for r in getattr(s, "rows", [])):
        notes.append(SKIP_HINT)
    notes += energy_lines(doc)  # output/environment.py
    return RunLines(notes=notes, verdicts=verdict_lines(doc),
                    warnings=killed_lines(doc) + stopped_lines(doc) + reach_lines(doc) + worker_death_lines(doc) + environment_change_lines(doc)
                    + soak_attainment_lines(doc) + soak_window_lines(doc),
                    errors=error_lines(doc, told))


def print_run(doc: Doc, console: Console, err: Console, output_format: str = "table", *,
              live: bool = False, records: Sequence[RequestRecord] | None = None) -> None:
    """The tables and lines of a run document, the same after a run (`live`) and from `analyze`: drawn
    for the terminal (`table`), or as JSON, CSV or Markdown on stdout, which then holds nothing else.
    `records`: the run's, for the tables drawn from them (a multi-turn run's per-turn tables)."""
    doc = RunDocument.of(doc)
    grids, lines = run_grids(doc, records), run_lines(doc, told=live)
    said = lines.notes + lines.verdicts
    if output_format == "json":
        console.file.write(grids_json(grids, lines.to_dict()))
    elif output_format == "csv":
        console.file.write(grids_csv(grids))
    elif output_format == "markdown":
        console.file.write(grids_markdown(grids, said))
    else:
        for grid in grids:
            print_table(console, grid)
        for line in lines.notes:
            say(console, line, "dim")
        for line in lines.verdicts:
            say(console, line)
    if output_format == "csv":
        for line in said:
            say(err, line)
    for line in lines.warnings:
        say(err, line, "yellow")
    for line in lines.errors:
        say(err, line, "red")


def say(console: Console, line: str, style: str | None = None) -> None:
    """One message: wrapped between words on a terminal, one line in a file or pipe (for grep)."""
    console.print(line, style=style, highlight=False, markup=False, soft_wrap=not console.is_terminal)

