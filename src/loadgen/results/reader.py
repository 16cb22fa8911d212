"""The results directory: the contract that `report`, `analyze`, `compare` and `gate` read.

    run.json        schema version, run metadata, per target: what the server said, a summary
                    of every level (see `metrics.LevelSummary`) and the saturation verdict
    requests.jsonl  one `RequestRecord` per line, every request of every level, failed ones too
    probe.jsonl     one `ProbeSample` per line: the server's /metrics and /slots during each level

`kind` says which command wrote it: "sweep" and "demo" (levels and verdicts), "prefill" and "depth"
(per target a `prefill` or `depth` section: `n_ctx` and one row per prompt length or depth, a
skipped row saying why), "soak" (its one level in `levels`, and a `soak` section: windows,
error-free time, drift).

The files are written atomically (temp file + rename), after every level and at the end, so a run
cut short leaves valid files marked `"complete": false` with every record gathered so far.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec

from . import __version__
from .core.clock import now_ns
from .core.errors import ResultsError
from .analysis.depth import summarize_depth, with_change
from .analysis.metrics import counter_delta, summarize_level
from .modes import ModeRun, ModeTarget, slot_context
from .analysis.prefill import summarize_prefill
from .core.records import LevelRun, ProbeSample, RequestRecord
from .analysis.saturation import analyze_target
from .analysis.soak import summarize_soak, window_seconds
from .sweep import SweepRun

SCHEMA = "loadgen.run"
SCHEMA_VERSION = 2
# Version 1 had no "level"/"rate" per level (every run was closed loop, keyed by concurrency) and
# no streaming fields: it is read by filling those in.
READABLE_VERSIONS = (1, 2)
RUN_FILE = "run.json"
REQUESTS_FILE = "requests.jsonl"
PROBE_FILE = "probe.jsonl"


def utc_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


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


def run_document(run: SweepRun, *, meta: dict[str, Any]) -> dict[str, Any]:
    """run.json's content: metadata plus per-target level summaries (a pure function)."""
    targets = []
    config = run.config
    for t in run.targets:
        levels = _level_summaries(t.levels)
        target = {
            "label": t.label,
            "url": t.target.url,
            "server": t.info.to_dict() if t.info else None,
            "error": t.error,
            "read_clock": t.read_clock,
            "levels": levels,
        }
        target["verdict"] = target_verdict(
            target, [r for lv in t.levels for r in lv.records], [s for lv in t.levels for s in lv.probe_samples],
            config.knee_gain, config.knee_latency, config.open_loop) if levels else None
        targets.append(target)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "loadgen_version": __version__,
        **meta,
        "complete": run.complete,
        "interrupted": run.interrupted,
        "config": run.config.to_dict(),
        "targets": targets,
    }


def target_verdict(target: dict[str, Any], records: list[RequestRecord], samples: list[ProbeSample],
                   knee_gain: float, knee_latency: float, open_loop: bool = False) -> dict[str, Any]:
    """The saturation verdict of one target of a run document (pure)."""
    server = target.get("server") or {}
    return analyze_target(target["label"], target["levels"], records, samples, server.get("total_slots"),
                          bool(server.get("metrics_enabled")), knee_gain, knee_latency, open_loop).to_dict()


def _atomic_write(path: Path, chunks: Iterable[str]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_results(out_dir: Path, run: SweepRun | ModeRun, *, meta: dict[str, Any]) -> dict[str, Any]:
    """Write requests.jsonl, probe.jsonl, then run.json, each atomically. Returns the run document.

    The API key is masked ("***") wherever a server quoted it back (an error message, a target's
    error), so no results file carries it.
    """
    secret = run.base.api_key if isinstance(run, ModeRun) else run.config.api_key
    meta = {**meta, "finished_utc": utc_now().isoformat()}
    doc = mode_document(run, meta=meta) if isinstance(run, ModeRun) else run_document(run, meta=meta)
    all_records = (r for t in run.targets for lv in t.levels for r in list(lv.records))
    if secret:
        doc = redact(doc, secret)
        all_records = (_redact_record(r, secret) for r in all_records)
    _atomic_write(out_dir / REQUESTS_FILE, _jsonl(all_records))
    _atomic_write(out_dir / PROBE_FILE, _jsonl(s for t in run.targets for lv in t.levels for s in list(lv.probe_samples)))
    _atomic_write(out_dir / RUN_FILE, [json.dumps(doc, indent=2, allow_nan=False) + "\n"])
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


def _level_summaries(levels: list[LevelRun]) -> list[dict[str, Any]]:
    return [{**summarize_level(lv.concurrency, list(lv.records),
                               lv.stopped_reason or (None if lv.finished else "in progress"),
                               counter_delta(lv.server_metrics_before, lv.server_metrics_after),
                               rate=lv.rate).to_dict(),
             "loop_lag_p99_ms": lv.loop_lag_p99_ms, "loop_lag_max_ms": lv.loop_lag_max_ms,
             "client_cpu_fraction": lv.client_cpu_fraction}
            for lv in levels]


def _step_rows(kind: str, t: ModeTarget) -> list[dict[str, Any]]:
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
    return [r.to_dict() for r in rows]


def mode_document(run: ModeRun, *, meta: dict[str, Any]) -> dict[str, Any]:
    """run.json of a prefill, depth or soak run: the sweep's contract plus one section per target
    named after the kind (a pure function). A soak's one level is also summarised in `levels`, as
    a sweep's would be, so `report` and `export` show it."""
    targets = []
    for t in run.targets:
        target: dict[str, Any] = {"label": t.label, "url": t.target.url,
                                  "server": t.info.to_dict() if t.info else None, "error": t.error,
                                  "levels": [], "verdict": None}
        if run.kind == "soak":
            target["levels"] = _level_summaries(t.levels)
            lv = t.levels[0] if t.levels else None
            if lv is not None and lv.start_ns:
                end = lv.end_ns if lv.finished else now_ns()
                target["soak"] = summarize_soak(list(lv.records), lv.start_ns, end,
                                                window_seconds(run.settings["duration_s"])).to_dict()
            else:
                target["soak"] = None
        else:
            target[run.kind] = {"n_ctx": slot_context(t), "rows": _step_rows(run.kind, t)}
        targets.append(target)
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "loadgen_version": __version__,
        **meta,
        "kind": run.kind,
        "complete": run.complete,
        "interrupted": run.interrupted,
        "config": {**run.base.to_dict(), **run.settings},
        "targets": targets,
    }


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


class _Distribution(msgspec.Struct):
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float


class _LevelSummary(msgspec.Struct):
    """The level fields readers index directly (`metrics.LevelSummary.to_dict`); the rest may be absent."""

    level: int | float  # the concurrency, or the request rate of an open-loop level
    concurrency: int
    requests_ok: int
    requests_failed: int
    output_tokens: int
    wall_s: float
    throughput_tok_s: float
    decode_tok_s_mean: float | None
    predicted_ms_mean: float | None
    rate: float | None = None
    requests_cancelled: int = 0
    errors_by_kind: dict[str, int] = {}
    latency_ms: _Distribution | None = None
    queue_wait_ms: _Distribution | None = None
    prompt_ms_mean: float | None = None
    stopped_reason: str | None = None
    server_metrics_delta: dict[str, float] = {}
    ttft_ms: _Distribution | None = None
    ttft_queue_ms: _Distribution | None = None
    tpot_ms: _Distribution | None = None
    itl_ms: _Distribution | None = None
    latency_uncorrected_ms: _Distribution | None = None
    schedule_lag_ms: _Distribution | None = None


class _LevelVerdict(msgspec.Struct):
    level: int | float
    requests: int
    queued: int
    queued_share: float
    queue_wait_raw_ms: _Distribution | None = None
    queue_wait_ms: _Distribution | None = None
    queued_wait_ms: _Distribution | None = None
    peak_deferred: float | None = None
    peak_busy_slots: int | None = None
    batching_gain: float | None = None
    failure_share: float = 0.0


class _Verdict(msgspec.Struct):
    verdict: list[str]
    levels: list[_LevelVerdict]
    total_slots: int | None = None
    overhead_ms: float | None = None
    saturated_at: int | None = None


class _Server(msgspec.Struct):
    props: dict[str, Any] | None = None
    metrics_enabled: bool = False
    total_slots: int | None = None


class _Target(msgspec.Struct):
    label: str
    levels: list[_LevelSummary] = []
    url: str | None = None
    server: _Server | None = None
    error: str | None = None
    read_clock: str | None = None
    verdict: _Verdict | None = None


class _Config(msgspec.Struct, frozen=True):
    knee_gain: float = 0.10
    knee_latency: float = 0.50
    mode: str = "concurrency"


class _RunFile(msgspec.Struct):
    """What run.json must hold for report, analyze, compare, gate and export to read it.

    Checked on load so that a damaged or hand-edited file is one line for the user, not a traceback
    in whichever reader trips over it first. Unknown fields are allowed (newer writers add some).
    """

    targets: list[_Target]
    config: _Config = _Config()
    kind: str = "sweep"
    complete: bool = False


def _check_contract(doc: dict[str, Any], path: Path) -> None:
    try:
        msgspec.convert(doc, _RunFile)
    except msgspec.ValidationError as exc:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({_first_line(exc)})") from None


def load_run(results_dir: Path) -> dict[str, Any]:
    """Read and check run.json. Raises ResultsError with a one-line reason."""
    path = Path(results_dir) / RUN_FILE
    if not path.is_file():
        raise ResultsError(f"{path} not found: give a directory written by `loadgen sweep`")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ResultsError(f"{path} is not valid JSON ({exc}); the run may have been written by another tool") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ResultsError(f"{path} is not a loadgen run file")
    if doc.get("schema_version") not in READABLE_VERSIONS:
        raise ResultsError(f"{path} has schema version {doc.get('schema_version')!r}; "
                           f"this loadgen reads versions {', '.join(map(str, READABLE_VERSIONS))}")
    if not isinstance(doc.get("targets"), list):
        raise ResultsError(f"{path} has no target list")
    if doc["schema_version"] == 1:
        _upgrade_v1(doc)
    _check_contract(doc, path)
    return doc


def _upgrade_v1(doc: dict[str, Any]) -> None:
    if isinstance(doc.get("config"), dict):
        doc["config"].setdefault("mode", "concurrency")
        doc["config"].setdefault("stream", False)
    def items(container: Any, key: str) -> list:  # what the contract check then judges, if damaged
        value = container.get(key) if isinstance(container, dict) else None
        return value if isinstance(value, list) else []

    for t in doc["targets"]:
        for lv in items(t, "levels"):
            if isinstance(lv, dict) and "concurrency" in lv:
                lv.setdefault("level", lv["concurrency"])
                lv.setdefault("rate", None)
        for lv in items(t.get("verdict") if isinstance(t, dict) else None, "levels"):
            if isinstance(lv, dict) and "concurrency" in lv:
                lv.setdefault("level", lv["concurrency"])


def open_loop(doc: dict[str, Any]) -> bool:
    """Whether a run document's levels are request rates (open loop) rather than concurrencies."""
    config = doc.get("config")
    return isinstance(config, dict) and config.get("mode") == "rate"


def _jsonl(items: Iterable[RequestRecord | ProbeSample]) -> Iterable[str]:
    encode = msgspec.json.encode
    for item in items:
        yield encode(item).decode() + "\n"


def _load_jsonl(path: Path, cls: type, what: str, missing_ok: bool = False,
                check: Callable[[Any], str | None] | None = None) -> list:
    out = []
    n = 0
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(f, 1):
                line = raw.decode("utf-8")
                if line.strip():
                    data = json.loads(line)
                    if not isinstance(data, dict):
                        raise ValueError("not an object")
                    item = cls.from_dict(data)
                    problem = check(item) if check is not None else None
                    if problem:
                        raise ValueError(problem)
                    out.append(item)
    except FileNotFoundError:
        if missing_ok:
            return []
        raise ResultsError(f"{path} not found") from None
    except (OSError, UnicodeDecodeError, ValueError, TypeError, msgspec.ValidationError) as exc:
        raise ResultsError(f"{path}:{n}: not a {what} ({_first_line(exc)})") from None
    return out


def _record_problem(r: RequestRecord) -> str | None:
    """What makes a record one loadgen never writes (readers rely on its times being in order)."""
    return "it completes before it was sent" if r.complete_ns < r.send_ns else None


def load_records(results_dir: Path) -> list[RequestRecord]:
    return _load_jsonl(Path(results_dir) / REQUESTS_FILE, RequestRecord, "request record", check=_record_problem)


def load_probe(results_dir: Path) -> list[ProbeSample]:
    return _load_jsonl(Path(results_dir) / PROBE_FILE, ProbeSample, "probe sample", missing_ok=True)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]


SECRET_OPTIONS = ("--api-key",)


def command_line(argv: list[str] | None = None) -> list[str]:
    """The command as typed, with the values of secret options replaced by "***"."""
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
            out.append(a)
    return out
