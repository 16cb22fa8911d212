"""The workload table: per level, the prompt and answer lengths the requests realised (run.json's
per-level `prompt_n` and `predicted_n` distributions), under the lengths they were drawn from.

Shown for a run whose config has a drawn workload (core/workload.py) only: a fixed-shape run's
lengths are one number each, already in its config.
"""

from __future__ import annotations

from typing import Any

from ..core.rundoc import Distribution, RunDocument
from .layout import Column, Grid, Num

_STATS = ("mean", "p50", "p90", "max")


def workload_table(doc: RunDocument | dict[str, Any]) -> Grid | None:
    """Realised input and output tokens per request (mean, p50, p90, max), per target and level;
    None for a run without a drawn workload."""
    doc = RunDocument.of(doc)
    workload = doc.config.workload_spec if doc.config is not None else None
    if workload is None:
        return None
    if workload.replay is not None:
        asked = f"replay of {workload.replay.trace}, lengths ×{workload.replay.scale_lengths}"
    else:
        asked = f"prompt {workload.prompt_tokens or 'as given'}, answer {workload.n_predict}"
    grid = Grid(f"workload: tokens per request (asked: {asked})",
                [Column("target", "left", key=True), Column("req/s" if doc.open_loop else "C", key=True),
                 *[Column(f"prompt_n\n{s}") for s in _STATS], *[Column(f"predicted_n\n{s}") for s in _STATS]])
    last = None
    for t in doc.targets:
        for lv in t.levels:
            grid.add_row(t.label if t.label != last else "", Num(lv.level, None),
                         *[Num(_stat(lv.prompt_n, s), 1 if s == "mean" else 0) for s in _STATS],
                         *[Num(_stat(lv.predicted_n, s), 1 if s == "mean" else 0) for s in _STATS])
            last = t.label
    return grid


def _stat(d: Distribution | None, name: str) -> float | None:
    return None if d is None else getattr(d, name)
