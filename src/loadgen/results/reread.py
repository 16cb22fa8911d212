"""A saved run read again beside its records: what `analyze` and `report` show of it.

run.json as written may lack a level the run was killed in (results/unfinished.py), and `analyze`
may ask for other percentiles (results/percentiles.py) or another saturation rule. Each amends
run.json's content, the dict (`reader.load_run_dict`), before it is typed: a level killed mid-run
is summarised whole, a verdict is drawn from the target as stored (its server's `slots_enabled`,
which the typed document drops). What leaves here is the typed document (`core.rundoc.RunDocument`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..analysis.saturation import target_verdict
from ..core.records import ProbeSample, RequestRecord
from ..core.rundoc import RunDocument
from .percentiles import with_percentiles
from .reader import load_run_dict
from .unfinished import summarise_killed_levels

DEFAULT_KNEE_GAIN, DEFAULT_KNEE_LATENCY = 0.10, 0.50  # the rule of a run whose config has none


def load_with_records(results_dir: Path, records: Sequence[RequestRecord]) -> RunDocument:
    """run.json with every level the run was killed in summarised from its records (`report`)."""
    doc = load_run_dict(results_dir)
    summarise_killed_levels(doc, records)
    return RunDocument.of(doc)


def reanalyse(results_dir: Path, records: list[RequestRecord], samples: list[ProbeSample],
              percentiles: Sequence[float] | None = None, knee_gain: float | None = None,
              knee_latency: float | None = None) -> RunDocument:
    """run.json as `analyze` shows it: killed levels summarised, `percentiles` (if any) computed from
    the records, and each target's verdict drawn again by the rule given, else the run's own."""
    doc = load_run_dict(results_dir)
    if percentiles:
        with_percentiles(doc, records, percentiles)
    summarise_killed_levels(doc, records)
    typed = RunDocument.of(doc)
    config = typed.config
    gain = _first(knee_gain, config.knee_gain if config else None, DEFAULT_KNEE_GAIN)
    latency = _first(knee_latency, config.knee_latency if config else None, DEFAULT_KNEE_LATENCY)
    if config is not None and config.classes:  # request classes side by side are no ladder: no verdict
        return typed
    for t, stored in zip(typed.targets, doc["targets"], strict=True):
        if t.levels:
            stored["verdict"] = target_verdict(stored, [r for r in records if r.target == t.label],
                                               [s for s in samples if s.target == t.label], gain, latency,
                                               typed.open_loop, trace=_is_replay(config))
    return RunDocument.of(doc)


def _is_replay(config: Any) -> bool:
    """Whether the run replayed a trace (its config's workload names one)."""
    spec = config.workload_spec if config is not None else None
    return spec is not None and spec.replay is not None


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)
