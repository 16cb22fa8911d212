"""Reading a results directory: the contract that `analyze`, `report`, `export`, `compare` and `gate` read.

    run.json        schema version, run metadata, per target: what the server said, a summary
                    of every level (`core.rundoc.LevelSummary`) and the saturation verdict
    requests.jsonl  one `RequestRecord` per line, every request of every level, failed ones too
    probe.jsonl     one `ProbeSample` per line: the server's /metrics and /slots during each level

`kind` says which command wrote it (core.rundoc.RunKind): "sweep", "demo", "capacity", "replay",
"prefix", "chat" and "cache-capacity" (levels and verdicts; before schema 4 all of them said
"sweep" but the demo), "prefill" and "depth"
(per target a `prefill` or `depth` section: `n_ctx` and one row per prompt length or depth, a
skipped row saying why), "soak" (its one level in `levels`, and a `soak` section: windows,
error-free time, drift).

Every file is checked on load, so a damaged or hand-edited one is one line for the user
(`ResultsError`), not a traceback in whichever reader trips over it first. This module imports
only core and the schema: reading a run loads neither the engine nor an HTTP client.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ..core.columnar import PARQUET_FILE
from ..core.columnar import read_records as read_parquet
from ..core.errors import ConfigError, ResultsError
from ..core.records import ProbeSample, RequestRecord
from ..core.rundoc import RunDocument, is_open_loop, read_rates
from .schema import PROBE_FILE, READABLE_VERSIONS, REQUESTS_FILE, RUN_FILE, SCHEMA, RunFile

open_loop = is_open_loop  # the one rule (core.rundoc), here for the readers of a results directory


def _check_contract(doc: dict[str, Any], path: Path) -> None:
    try:
        msgspec.convert(doc, RunFile)
    except msgspec.ValidationError as exc:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({_first_line(exc)})") from None


def load_run(results_dir: Path) -> RunDocument:
    """run.json as the typed document every reader reads by attribute (`core.rundoc.RunDocument`):
    read, checked and upgraded (`load_run_dict`), then typed. Raises ResultsError with a one-line reason."""
    path = Path(results_dir) / RUN_FILE
    try:
        return RunDocument.of(load_run_dict(results_dir))
    except msgspec.ValidationError as exc:
        raise ResultsError(f"{path} is damaged or not written by this loadgen ({_first_line(exc)})") from None


def _not_a_run(folder: Path) -> str:
    """Why `folder` holds no run.json, in one line: a cache-capacity folder's runs are its k-K folders."""
    if (folder / "cache-capacity.json").is_file():
        runs = sorted((p.name for p in folder.glob("k-*") if (p / RUN_FILE).is_file()),
                      key=lambda name: int(name[2:]) if name[2:].isdigit() else 0)
        return (f"{folder} is a `loadgen cache-capacity` folder (its summary: cache-capacity.json); its runs are "
                f"{', '.join(runs) or 'none yet'}: give one of those")
    return f"{folder / RUN_FILE} not found: give a directory written by `loadgen sweep`"


def load_run_dict(results_dir: Path) -> dict[str, Any]:
    """run.json's content as a dict, read and checked (the schema, `schema.RunFile`) and upgraded.

    For results/ alone, which amends a run before it is typed (a level killed mid-run, `analyze
    --percentiles`, a verdict drawn again: `results/reread.py`), and for the writers that pass
    run.json on verbatim (the JSON and CSV exporters: a typed float turns a stored 0 into 0.0, a
    default fills a field the file lacks). Every other reader reads `load_run`'s typed document.
    Raises ResultsError with a one-line reason."""
    path = Path(results_dir) / RUN_FILE
    if not path.is_file():
        raise ResultsError(_not_a_run(Path(results_dir)))
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
    doc = read_rates(doc)  # --rate inf, stored as "inf"
    if doc["schema_version"] == 1:
        upgrade_v1(doc)
    _check_contract(doc, path)
    return doc


def upgrade_v1(doc: dict[str, Any]) -> None:
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


def _load_jsonl(path: Path, cls: type[RequestRecord] | type[ProbeSample], what: str, missing_ok: bool = False,
                check: Callable[[Any], str | None] | None = None, cut_short_ok: bool = False) -> list:
    out = []
    n = 0
    try:
        with path.open("rb") as f:
            for n, raw in enumerate(f, 1):  # noqa: B007 (the handlers below name line n)
                if not raw.endswith(b"\n") and cut_short_ok:
                    break  # the writer was killed mid-write: the file is read up to its last complete record
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
    """Every record; of a run that did not finish (run.json `complete` false), a last line cut short
    by a killed writer is left out: the file is read up to its last complete record."""
    try:
        unfinished = json.loads((Path(results_dir) / RUN_FILE).read_text(encoding="utf-8")).get("complete") is False
    except (OSError, ValueError, AttributeError):
        unfinished = False
    parquet = Path(results_dir) / PARQUET_FILE
    if parquet.exists() and not (Path(results_dir) / REQUESTS_FILE).exists():
        return _load_parquet(parquet)
    return _load_jsonl(Path(results_dir) / REQUESTS_FILE, RequestRecord, "request record", check=_record_problem,
                       cut_short_ok=unfinished)


def _load_parquet(path: Path) -> list[RequestRecord]:
    """requests.parquet (core/columnar.py), checked as the JSON lines are."""
    try:
        rows = read_parquet(path)
    except ConfigError:
        raise  # no pyarrow: the line says how to get it
    except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
        raise ResultsError(f"{path} is not a records file ({_first_line(exc)}); a run killed while writing "
                           "Parquet leaves none (JSON lines survive a kill)") from None
    out = []
    for n, row in enumerate(rows, 1):
        try:
            record = RequestRecord.from_dict(row)
        except msgspec.ValidationError as exc:
            raise ResultsError(f"{path}: row {n}: not a request record ({_first_line(exc)})") from None
        if (problem := _record_problem(record)) is not None:
            raise ResultsError(f"{path}: row {n}: not a request record ({problem})")
        out.append(record)
    return out


def load_probe(results_dir: Path) -> list[ProbeSample]:
    return _load_jsonl(Path(results_dir) / PROBE_FILE, ProbeSample, "probe sample", missing_ok=True)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _first_line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:200]
