"""A --models run against a router: its load timeline written beside the records (router.json),
and per target each model's requests, tokens, failures and cold loads, with the thrash verdict
(analysis/router.py, docs/router.md).

router.json: `{"targets": [{"label", "models_max", "events": [{"t_ns", "model", "status"}]}]}`,
each event a change of one model's /models status as loadgen's poll saw it, `t_ns` on the
records' clock (requests.jsonl's send_ns); `read_timelines` reads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

import msgspec

from ..analysis.router import ModelFigures, RouterVerdict
from ..analysis.router import router_view as target_router_view
from ..core.errors import ResultsError
from ..core.model_mix import ModelEvent
from ..core.records import RequestRecord
from ..core.rundoc import RouterSummary
from ..results.atomic import write_json
from .layout import Column, Grid, Num, print_table

FILE = "router.json"


class Timeline(msgspec.Struct, frozen=True):
    """One target's polled /models changes and its router's --models-max, as router.json holds them."""

    label: str
    models_max: int | None = None
    events: list[ModelEvent] = []


class _RouterFile(msgspec.Struct, frozen=True):
    targets: list[Timeline] = []


def write_timelines(out_dir: Path, targets: Sequence[Any]) -> None:
    """The targets' (run/state.py TargetRun) polled /models changes, as router.json."""
    typed = _RouterFile([Timeline(t.label, t.models_max, list(t.model_events)) for t in targets])
    write_json(out_dir / FILE, msgspec.to_builtins(typed))


def read_timelines(out_dir: Path) -> list[Timeline]:
    """router.json's timelines; none when the run has no such file."""
    path = out_dir / FILE
    if not path.exists():
        return []
    try:
        return msgspec.json.decode(path.read_bytes(), type=_RouterFile).targets
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ResultsError(f"{path}: not a router timeline loadgen wrote ({exc})") from None


def router_view(records: Sequence[RequestRecord], timeline: Timeline) -> tuple[list[ModelFigures], RouterVerdict | None]:
    """One target's per-model figures and its verdict."""
    return target_router_view([r for r in records if r.target == timeline.label], timeline.events,
                              timeline.models_max)


def _per_minute(count: int, records: Sequence[RequestRecord]) -> float | None:
    if not records:
        return None
    span_s = (max(r.complete_ns for r in records) - min(r.send_ns for r in records)) / 1e9
    return count / span_s * 60 if span_s > 0 else None


def router_grid(records: Sequence[RequestRecord], timelines: Sequence[Timeline]) -> tuple[Grid, list[str]]:
    """The per-model table of every target, and each target's verdict line."""
    grid = Grid("models behind the router (--models)",
                [Column("target", key=True), Column("model", key=True), Column("requests"), Column("ok"),
                 Column("failed"), Column("output\ntokens"), Column("waited\nfor load"), Column("cold load\nms p50"),
                 Column("load\nms p50"), Column("loads\n/min"), Column("unloads\n/min"), Column("failures")])
    lines = []
    for tl in timelines:
        figures, verdict = router_view(records, tl)
        mine = [r for r in records if r.target == tl.label]
        for i, f in enumerate(figures):
            grid.add_row(tl.label, f.model, Num(f.requests, None), Num(f.ok, None), Num(f.failed, None),
                         Num(f.output_tokens, None), Num(f.waited, None),
                         Num(median(f.cold_load_ms) if f.cold_load_ms else None, 0),
                         Num(median(f.load_ms) if f.load_ms else None, 0),
                         Num(_per_minute(f.loads, mine), 1), Num(_per_minute(f.unloads, mine), 1),
                         ", ".join(f"{k} {n}" for k, n in f.failures.items()) or "-",
                         end_section=i == len(figures) - 1)
        if verdict is not None:
            lines.append(f"{tl.label}: {verdict.line}")
    grid.caption = ("waited for load: requests sent before their model was loaded; cold load: their TTFT less "
                    "their own prefill (timings.prompt_ms); load: /models 'loading' to 'loaded' as polled")
    return grid, lines


def summarize_router(records: Sequence[RequestRecord], out_dir: Path) -> None:
    """A --models run's router summary per target written into run.json (`router`, for report and
    export), from the records and router.json."""
    from ..analysis.router import router_summary
    from ..results.writer import add_router_summaries  # the run's writer: not for a report of a saved run

    add_router_summaries(out_dir, {tl.label: router_summary([r for r in records if r.target == tl.label], tl.events,
                                                            tl.models_max) for tl in read_timelines(out_dir)})


def print_router(console: Any, records: Sequence[RequestRecord], out_dir: Path) -> None:
    """A --models run's per-model table and verdicts, when its folder holds router.json (after the run
    and from `loadgen analyze`)."""
    timelines = read_timelines(out_dir)
    if not timelines:
        return
    grid, lines = router_grid(records, timelines)
    print_table(console, grid)
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=not console.is_terminal)  # one line in a pipe


ROW_FIELDS = ("target", "model", "requests", "ok", "failed", "loads", "cold_load_ms_p50", "waited", "models_max",
              "thrash", "verdict")


def summary_rows(label: str, summary: RouterSummary) -> list[dict[str, Any]]:
    """router.csv's rows of one target (run.json's `router`): one per model, each with the verdict."""
    return [{"target": label, **msgspec.to_builtins(m), "models_max": summary.models_max, "thrash": summary.thrash,
             "verdict": summary.verdict} for m in summary.models]


def summary_grid(summary: RouterSummary) -> Grid:
    """run.json's router summary of one target as a table (report.html; its verdict is a sentence there)."""
    grid = Grid(f"models behind the router (--models-max {summary.models_max or '?'})",
                [Column("model", key=True), Column("requests"), Column("ok"), Column("failed"), Column("loads"),
                 Column("waited\nfor load"), Column("cold load\nms p50")])
    for m in summary.models:
        grid.add_row(m.model, Num(m.requests, None), Num(m.ok, None), Num(m.failed, None), Num(m.loads, None),
                     Num(m.waited, None), Num(m.cold_load_ms_p50, 0))
    return grid
