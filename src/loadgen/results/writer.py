"""Writing a results directory: run.json built from a run (pure), then the files, each atomically.

The files are written atomically (temp file + rename), after every level and at the end, so a run
cut short leaves valid files marked `"complete": false` with every record gathered so far. What
they hold is results/schema.py's; reading them back is results/reader.py's.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import json
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from .. import __version__
from ..analysis.aggregate import LevelAggregate, of_level
from ..analysis.cache import lowest_level_prefill_ms_per_token
from ..analysis.depth import summarize_depth, with_change
from ..analysis.embedding_check import text_figures
from ..analysis.energy import energy_of, level_energy
from ..analysis.env_drift import level_changes
from ..analysis.interference import ClassPhases, Interference, interference
from ..analysis.metrics import counter_delta
from ..analysis.prefill import summarize_prefill
from ..analysis.saturation import target_verdict
from ..analysis.slo import Slo, SloTally
from ..analysis.soak import summarize_soak, summarize_tally, window_seconds
from ..analysis.soak_machine import SoakMachine, per_window
from ..analysis.trim import Trim, Trimmed, trim_level
from ..core.baseurl import masked
from ..core.clock import now_ns
from ..core.columnar import PARQUET_FILE
from ..core.environment import ServerBoot, thinned
from ..core.errors import ResultsError
from ..core.records import LevelRun, ProbeSample, RequestRecord, encode_lines
from ..core.recordsink import RecordSink
from ..core.request_class import ALONE, TOGETHER
from ..core.rundoc import LevelSummary, LevelTrim, json_safe
from ..run.config import SoakSettings
from ..run.state import Run, TargetRun, slot_context
from .atomic import atomic_write
from .history import append_run
from .schema import PROBE_FILE, REQUESTS_FILE, RUN_FILE, SCHEMA, SCHEMA_VERSION


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


def default_dir(base: Path, kind: str, when: _dt.datetime | None = None) -> Path:
    """results/<UTC time>-<kind>, with a -2, -3, ... suffix when a run of the same second has it."""
    stamp = (when or utc_now()).strftime("%Y%m%dT%H%M%SZ")
    path = base / f"{stamp}-{kind}"
    n = 2
    while path.exists():
        path = base / f"{stamp}-{kind}-{n}"
        n += 1
    return path


def host_facts(event_loop: str) -> dict[str, Any]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "event_loop": event_loop,
    }


def _idle_w(run: Run) -> dict[str, float] | None:
    """The idle power measured before the first level (the baseline of net J/token), by source."""
    return run.environment.idle_power_w if run.environment is not None else None


def run_document(run: Run, *, meta: dict[str, Any]) -> dict[str, Any]:
    """run.json's content: metadata plus per-target level summaries (a pure function)."""
    targets = []
    config = run.config
    idle_w = _idle_w(run)
    for t in run.targets:
        levels = _level_summaries(t.levels, config.slo, idle_w, config.percentiles, config.trim,
                                  config.generation.n_predict, config.answer_items)
        target = {
            "label": t.label,
            "url": t.target.display,
            "server": t.info.to_dict() if t.info else None,
            "error": t.error,
            "read_clock": t.read_clock,
            "levels": levels,
        }
        if t.dataset_fit is not None:  # --n-predict dataset: entries beyond the slot's context, skipped
            target["dataset"] = {"entries": t.dataset_fit[0], "skipped": t.dataset_fit[1]}
        if t.lengths_floored is not None:  # prompts too short for the salt, raised (run/trace_prompts.py)
            floored, requests, floor_tokens = t.lengths_floored
            target["lengths_changed"] = {"floored": floored, "requests": requests, "floor_tokens": floor_tokens}
        if t.images is not None:  # --images: their tokens and cost, measured before the first level (run/images.py)
            target["images"] = t.images
        if config.classes:  # classes side by side, not a ladder: how each fared beside the others instead
            target["verdict"] = None
            target["interference"] = [v.to_dict() for v in class_interference(t, levels)]
        else:
            target["verdict"] = target_verdict(
                target, [r for lv in t.levels for r in _verdict_records(lv)],
                [s for lv in t.levels for s in lv.probe_samples],
                config.knee_gain, config.knee_latency, config.open_loop,
                trace=config.replay is not None) if levels else None
        targets.append(target)
    doc = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "loadgen_version": __version__,
        **meta,
        "complete": run.complete,
        "interrupted": run.interrupted,
        "config": {**run.config.to_dict(), **run.settings_dict()},
        "targets": targets,
    }
    if run.environment is not None:
        doc["environment"] = run.environment.to_dict()
    return doc




def write_results(out_dir: Path, run: Run, *, meta: dict[str, Any], final: bool = True) -> dict[str, Any]:
    """Write requests.jsonl, probe.jsonl, then run.json, each atomically. Returns the run document.

    `final` False: a checkpoint of a run still going, which is never `complete`.

    The API key (and any key in a target's URL query) is masked ("***") wherever a server quoted it
    back (an error message, a target's error), so no results file carries it.
    """
    meta = {**meta, "finished_utc": utc_now().isoformat()}
    doc = run_document(run, meta=meta) if run.kind.has_levels else mode_document(run, meta=meta)
    doc["complete"] = doc["complete"] and final
    doc["config"]["records"] = run.sink.keep if run.sink is not None else "all"  # which records the file has
    secrets = run.config.secrets
    for secret in secrets:
        doc = redact(doc, secret)
    if run.sink is None:  # else the records went to the file as they came (core/recordsink.py)
        all_records = (r for t in run.targets for lv in t.levels for r in list(lv.records))
        for secret in secrets:
            all_records = (_redact_record(r, secret) for r in all_records)
        atomic_write(out_dir / REQUESTS_FILE, _jsonl(all_records))
    if run.probe_sink is None:  # else the samples go to the file as they are scraped
        atomic_write(out_dir / PROBE_FILE, _jsonl(s for t in run.targets for lv in t.levels for s in list(lv.probe_samples)))
    atomic_write(out_dir / RUN_FILE, [json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"])
    return doc


def start_results(out_dir: Path, run: Run, *, meta: dict[str, Any]) -> None:
    """The results directory as a run starts: run.json (no levels yet, `complete` false) beside the
    records file it streams into, so a run killed outright still reads as an incomplete run."""
    write_results(out_dir, run, meta=meta, final=False)


class RunFiles:
    """A results folder as a run's session writes it (run/session.py's `ResultsWriter`): the records
    file the levels stream into (`records`: which ones, see core/recordsink.py; `records_format`:
    jsonl or parquet), probe.jsonl streamed as the probe scrapes, run.json at the start, at each
    checkpoint (the first once the targets' facts are known, before the first level) and at the end."""

    def __init__(self, out_dir: Path, records: str = "all", records_format: str = "jsonl"):
        self.out_dir, self.records, self.records_format = out_dir, records, records_format
        self.where = str(out_dir)
        self.meta: dict[str, Any] = {}

    def start(self, run: Run, event_loop: str) -> None:
        self.meta = {"kind": run.kind.value, "command": command_line(), "started_utc": utc_now().isoformat(),
                     "host": host_facts(event_loop)}
        name = PARQUET_FILE if self.records_format == "parquet" else REQUESTS_FILE
        run.sink = RecordSink(self.out_dir / name, keep=self.records, secrets=run.config.secrets,
                              format=self.records_format)
        # probe.jsonl grows scrape by scrape (a run killed in a level keeps what the probe saw);
        # the final write rewrites it whole, in simulated time for the demo (run/session.py)
        run.probe_sink = RecordSink(self.out_dir / PROBE_FILE)
        start_results(self.out_dir, run, meta=self.meta)

    def checkpoint(self, run: Run) -> None:
        write_results(self.out_dir, run, meta=self.meta, final=False)

    def final(self, run: Run) -> dict[str, Any]:
        doc = write_results(self.out_dir, run, meta=self.meta)
        append_run(doc, self.out_dir)  # the last write only: checkpoints never reach the history
        return doc


def redact(value: Any, secret: str) -> Any:
    """`value` (JSON-like) with every occurrence of `secret` in its strings replaced by "***"."""
    if isinstance(value, str):
        return value.replace(secret, "***") if secret in value else value
    if isinstance(value, dict):
        return {k: redact(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, secret) for v in value]
    return value


def _redact_record(r: RequestRecord, secret: str) -> RequestRecord:
    if r.error_message is not None and secret in r.error_message:
        return msgspec.structs.replace(r, error_message=r.error_message.replace(secret, "***"))
    return r


def _verdict_records(lv: LevelRun) -> list[RequestRecord]:
    """What the verdict reads of a level: its records, or a streamed level's sample of them."""
    return list(lv.aggregate.sample) if lv.aggregate is not None else list(lv.records)


def _level_summaries(levels: list[LevelRun], slo: Slo | None = None, idle_w: dict[str, float] | None = None,
                     percentiles: tuple[float, ...] = (), trim: Trim | None = None,
                     n_predict: int | None = None, items: int | None = None) -> list[dict[str, Any]]:
    """Each level's summary as run.json holds it; `items`: texts per request of an API that answers
    without generating (embeddings, rerank), whose text figures it then carries."""
    out = []
    aggregates = [_trimmed(lv, trim) for lv in levels]
    # the prefill the cache saved, priced at the lowest level's cost per token (analysis/cache.py)
    ms_per_token = lowest_level_prefill_ms_per_token(
        (lv.level, *aggregate.prefill_totals()) for lv, (_, aggregate) in zip(levels, aggregates, strict=True))
    for lv, (trimmed, aggregate) in zip(levels, aggregates, strict=True):
        summary = aggregate.summary(lv.concurrency, lv.stopped_reason or (None if lv.finished else "in progress"),
                                    counter_delta(lv.server_metrics_before, lv.server_metrics_after), rate=lv.rate,
                                    percentiles=percentiles, prefill_ms_per_token=ms_per_token,
                                    n_predict=n_predict)
        if items is not None:
            summary = msgspec.structs.replace(summary, **text_figures(summary.requests_ok, summary.input_tokens or 0,
                                                                      summary.wall_s, items))
        out.append(_with_environment(_with_workers(msgspec.structs.replace(
            summary, **_schedule_counts(lv), loop_lag_p99_ms=lv.loop_lag_p99_ms, loop_lag_max_ms=lv.loop_lag_max_ms,
            client_cpu_fraction=lv.client_cpu_fraction, slo=_slo_of(lv, slo, summary.wall_s, trimmed),
            trimmed=None if trimmed is None else LevelTrim(trimmed.head, trimmed.tail, round(trimmed.cut_s, 6),
                                                           trimmed.too_short),
        ).to_dict(client_load=True), lv), lv, idle_w, summary.output_tokens))
    return out


def _schedule_counts(lv: LevelRun) -> dict[str, int | None]:
    """An open-loop level's scheduled requests and, once it ended, those never sent: the schedule
    less every request sent (each has a record, whatever became of it; --trim leaves none out here)."""
    if lv.scheduled is None:
        return {}
    not_sent = max(0, lv.scheduled - of_level(lv).sent) if lv.finished else None
    return {"requests_scheduled": lv.scheduled, "requests_not_sent": not_sent}


def _trimmed(lv: LevelRun, trim: Trim | None) -> tuple[Trimmed | None, LevelAggregate]:
    """--trim: a finished level's records split (analysis/trim.py) and the aggregate of those its
    figures keep, made once (`lv.trimmed`); else none and the level's own aggregate."""
    if trim is None or not lv.finished:
        return None, of_level(lv)
    if lv.trimmed is None:
        trimmed = trim_level(list(lv.records), trim)
        lv.trimmed = trimmed, LevelAggregate.of(trimmed.kept) if trimmed.dropped else of_level(lv)
    return lv.trimmed


def _slo_of(lv: LevelRun, slo: Slo | None, wall_s: float, trimmed: Trimmed | None = None) -> dict[str, Any] | None:
    """The level judged against the run's latency targets: its streamed tally, else its records
    (--trim: those its figures keep); a class's own targets when the run has none."""
    if slo is None:
        return None if lv.slo_tally is None else lv.slo_tally.result(wall_s).to_dict()
    if trimmed is not None and trimmed.dropped:
        tally = SloTally.of(slo, trimmed.kept)
    else:
        tally = lv.slo_tally if lv.slo_tally is not None else SloTally.of(slo, list(lv.records))
    return tally.result(wall_s).to_dict()


def _with_environment(summary: dict[str, Any], lv: LevelRun, idle_w: dict[str, float] | None,
                      output_tokens: int) -> dict[str, Any]:
    """A level (or a prefill's or depth's step) the machine was sampled through also holds its
    samples, what changed during it (analysis/env_drift.level_changes) and its energy
    (analysis/energy.level_energy: per output token), both from every sample, while at most
    STORED_SAMPLES of them are stored; absent otherwise."""
    if lv.environment:
        samples = list(lv.environment)
        summary["environment"] = msgspec.to_builtins(thinned(samples))
        summary["environment_changed"] = level_changes(samples)
        energy = level_energy(samples, output_tokens, idle_w)
        if energy:
            summary["energy"] = [e.to_dict() for e in energy]
    return summary


def _with_workers(summary: dict[str, Any], lv: LevelRun) -> dict[str, Any]:
    """A level run by --workers processes also says what each did (absent from one-process runs);
    a level of a run of classes, its class and phase."""
    if lv.workers is not None:
        summary["workers"] = lv.workers
    if lv.request_class is not None:
        summary["request_class"], summary["phase"] = lv.request_class, lv.phase
    return summary


def class_interference(t: TargetRun, levels: list[dict[str, Any]]) -> list[Interference]:
    """Each class's level alone and beside the others, compared (analysis/interference.py)."""
    phases: dict[str, dict[str, LevelSummary]] = {}
    for lv, summary in zip(t.levels, levels):
        if lv.request_class is not None and lv.phase is not None and lv.finished:
            phases.setdefault(lv.request_class, {})[lv.phase] = msgspec.convert(summary, LevelSummary, strict=False)
    slots = t.info.total_slots if t.info else None
    return interference([ClassPhases(name, p.get(ALONE), p.get(TOGETHER)) for name, p in phases.items()], slots)


def _step_rows(kind: str, t: TargetRun, idle_w: dict[str, float] | None) -> list[dict[str, Any]]:
    """A prefill's or depth's rows, each with its step's machine samples as a sweep's level has them."""
    rows = []
    for step in t.steps:
        rs = list(step.level.records) if step.level else []
        if kind == "prefill":
            row: Any = summarize_prefill(step.size, rs, step.note)
        else:
            row = summarize_depth(step.size, rs, step.note)
        if step.skipped:
            row = replace(row, skipped=step.skipped)
        elif step.level is not None and not step.level.finished:
            row = replace(row, skipped="in progress")
        elif step.level is not None and step.level.stopped_reason:
            row = replace(row, skipped=f"stopped: {step.level.stopped_reason}")
        rows.append(row)
    if kind == "depth":
        rows = with_change(rows)
    return [r.to_dict() if step.level is None else
            _with_environment(r.to_dict(), step.level, idle_w, of_level(step.level).output_tokens)
            for r, step in zip(rows, t.steps)]


def _soak_section(lv: LevelRun | None, settings: SoakSettings, slo: Slo | None,
                  idle_w: dict[str, float] | None) -> dict[str, Any] | None:
    """A soak's section: its windows, each with the machine under it when it was sampled."""
    if lv is None or not lv.start_ns:
        return None
    end = lv.end_ns if lv.finished else now_ns()
    section = (summarize_tally(lv.tally, lv.start_ns, end) if lv.tally is not None else
               summarize_soak(list(lv.records), lv.start_ns, end, window_seconds(settings.duration_s), slo)).to_dict()
    if isinstance(lv.environment, SoakMachine):
        _with_window_machines(section["windows"], lv.environment, idle_w)
    return section


def _with_window_machines(windows: list[dict[str, Any]], machine: SoakMachine, idle_w: dict[str, float] | None) -> None:
    """Each soak window the machine was sampled in gains what changed during it and its energy
    (per its output tokens), as folded when it closed (analysis/soak_machine.py)."""
    for window, folded in zip(windows, per_window(machine.windows(), len(windows))):
        if folded is None:
            continue
        window["environment_changed"] = folded.changes
        energy = energy_of(folded.energy_j, folded.seconds, window["output_tokens"], idle_w)
        if energy:
            window["energy"] = [e.to_dict() for e in energy]


def mode_document(run: Run, *, meta: dict[str, Any]) -> dict[str, Any]:
    """run.json of a prefill, depth or soak run: the sweep's contract plus one section per target
    named after the kind (a pure function). A soak's one level is also summarised in `levels`, as
    a sweep's would be, so `report` and `export` show it."""
    targets = []
    for t in run.targets:
        target: dict[str, Any] = {"label": t.label, "url": t.target.display,
                                  "server": t.info.to_dict() if t.info else None, "error": t.error,
                                  "levels": [], "verdict": None}
        if run.kind == "soak":
            assert isinstance(run.settings, SoakSettings)  # a soak's Run carries them (kinds/soak/command.py)
            target["levels"] = _level_summaries(t.levels, run.config.slo, _idle_w(run),
                                                 percentiles=run.config.percentiles, trim=run.config.trim,
                                                 n_predict=run.config.generation.n_predict)
            target["soak"] = _soak_section(t.levels[0] if t.levels else None, run.settings, run.config.slo, _idle_w(run))
        elif (kind := run.kind.kind).section_writer is not None and kind.section is not None:
            module, _, attr = kind.section_writer.partition(":")
            target[kind.section] = getattr(importlib.import_module(module), attr)(t, run)
        else:
            target[run.kind.value] = {"n_ctx": slot_context(t), "rows": _step_rows(run.kind, t, _idle_w(run))}
        targets.append(target)
    doc = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "loadgen_version": __version__,
        **meta,
        "kind": run.kind.value,
        "complete": run.complete,
        "interrupted": run.interrupted,
        "config": {**run.config.to_dict(), **run.settings_dict()},
        "targets": targets,
    }
    if run.environment is not None:
        doc["environment"] = run.environment.to_dict()
    return doc


def add_server_boot(run_dir: Path, label: str, boot: ServerBoot) -> bool:
    """Add what loadgen saw of a server it started itself (`loadgen grid`, after the measurement:
    the flags and boot decisions, analysis/bootlog.py) to the run's fingerprint under the target's
    `label`, rewriting run.json atomically. False, and nothing written, when the run recorded no
    environment (--no-environment) or its run.json cannot be read."""
    path = run_dir / RUN_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    environment = doc.get("environment") if isinstance(doc, dict) else None
    if not isinstance(environment, dict):
        return False
    environment["boot"] = {**(environment.get("boot") or {}), label: msgspec.to_builtins(boot)}
    atomic_write(path, [json.dumps(doc, indent=2, allow_nan=False) + "\n"])
    return True


def add_router_summaries(run_dir: Path, summaries: dict[str, Any]) -> bool:
    """Add a --models run's router summary per target label (core/rundoc.py RouterSummary, made from
    the records on disk and router.json after the run, output/router.py) to run.json's targets as
    "router", rewriting it atomically. False, and nothing written, when run.json cannot be read."""
    path = run_dir / RUN_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    for target in doc.get("targets") or [] if isinstance(doc, dict) else []:
        if isinstance(target, dict) and target.get("label") in summaries:
            target["router"] = msgspec.to_builtins(summaries[target["label"]])
    atomic_write(path, [json.dumps(json_safe(doc), indent=2, allow_nan=False) + "\n"])
    return True


def prepare_dir(out_dir: Path, force: bool) -> Path:
    """Create the output directory; refuse a non-empty one unless `force`."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ResultsError(f"{out_dir} exists and is not a directory; choose another --output")
    if out_dir.is_dir() and (out_dir / RUN_FILE).exists() and not force:
        raise ResultsError(f"{out_dir} already holds a run; choose another --output or add --force")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".loadgen-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ResultsError(f"cannot write to {out_dir} ({exc.strerror}); choose another --output") from None
    return out_dir


def _jsonl(items: Iterable[RequestRecord | ProbeSample]) -> Iterable[str]:
    encode = msgspec.json.Encoder().encode_lines
    for item in items:
        yield encode_lines(encode, [item]).decode()  # a --rate inf level's "inf"


SECRET_OPTIONS = ("--api-key",)


def command_line(argv: list[str] | None = None) -> list[str]:
    """The command as typed, with the values of secret options and key-like URL query values
    replaced by "***"."""
    args = list(sys.argv if argv is None else argv)
    out = [Path(args[0]).name] if args else []
    hide_next = False
    for a in args[1:]:
        if hide_next:
            out.append("***")
            hide_next = False
        elif a in SECRET_OPTIONS:
            out.append(a)
            hide_next = True
        elif a.startswith(tuple(o + "=" for o in SECRET_OPTIONS)):
            out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(masked(a) if "://" in a else a)  # a URL's key-like query values
    return out
