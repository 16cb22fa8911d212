"""The history store (issue 49): one row per target and level of every finished or stopped run that has
levels, beside a small `runs` table, so results can be compared over builds and time.

Where: $LOADGEN_HISTORY (a path, a `postgresql://` URL, or "off" for none), else
$XDG_DATA_HOME/loadgen/history.sqlite, else ~/.local/share/loadgen/history.sqlite. A path is a SQLite
file (the standard library's sqlite3: WAL and a busy timeout); a URL is a team's PostgreSQL database
(results/history_postgres.py, the optional extra `loadgen[postgres]`). The SQL below is written once
for both, with `?` placeholders (`_Db` adapts them). Every writer adds a run in one transaction; a
store that cannot be written never costs the run: `append_run` warns in one line and returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..analysis.history_check import RunIdentity
from ..analysis.history_trend import FIGURES, TrendRow
from ..core.kinds import KINDS

SCHEMA_VERSION = 2
OFF = "off"
BUSY_TIMEOUT_MS = 10_000
# The kinds whose runs have levels (core/kinds.py): the rows the history holds.
LEVEL_KINDS = frozenset(name for name, kind in KINDS.items() if kind.levels)

_RUNS = """CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY, folder TEXT NOT NULL, started_utc TEXT, finished_utc TEXT, kind TEXT,
    loadgen_version TEXT, workload_hash TEXT, machine_hash TEXT, machine TEXT, complete INTEGER)"""
_LEVELS = """CREATE TABLE IF NOT EXISTS levels (
    run_id INTEGER NOT NULL REFERENCES runs(run_id), folder TEXT, started_utc TEXT, kind TEXT,
    loadgen_version TEXT, workload_hash TEXT, machine_hash TEXT, label TEXT, build_info TEXT,
    model TEXT, model_size INTEGER, level INTEGER, rate REAL, throughput_tok_s REAL, request_rate REAL,
    latency_ms_p50 REAL, latency_ms_p99 REAL, ttft_ms_p50 REAL, ttft_ms_p99 REAL,
    requests_ok INTEGER, requests_failed INTEGER, server_flags TEXT, model_fingerprint TEXT)"""
# What a store of each older version needs to become the current one, applied in order on first use.
# 2: `server_flags`, the flags of a server loadgen started (grid, tune, bisect), and `model_fingerprint`
# (results/model_fingerprint.py), in the identity.
MIGRATIONS = {1: ("ALTER TABLE levels ADD COLUMN server_flags TEXT", "ALTER TABLE levels ADD COLUMN model_fingerprint TEXT")}
LEVEL_COLUMNS = ("run_id", "folder", "started_utc", "kind", "loadgen_version", "workload_hash", "machine_hash",
                 "label", "build_info", "model", "model_size", "level", "rate", "throughput_tok_s",
                 "request_rate", "latency_ms_p50", "latency_ms_p99", "ttft_ms_p50", "ttft_ms_p99",
                 "requests_ok", "requests_failed", "server_flags", "model_fingerprint")


# Where a store is: a SQLite file's path, or a PostgreSQL URL (a str).
Location = Path | str
URL_SCHEMES = ("postgresql://", "postgres://")


class HistoryError(Exception):
    """The store could not be opened, read or written (the database's own message)."""


def location(text: str | Path) -> Location:
    """A --history value or $LOADGEN_HISTORY: a URL as given, else a path."""
    text = str(text)
    return text if text.startswith(URL_SCHEMES) else Path(text).expanduser()


def exists(where: Location) -> bool:
    """Whether there is a store to read (a database server is asked when it is read)."""
    return isinstance(where, str) or where.exists()


def default_path(environ: Mapping[str, str] | None = None) -> Location | None:
    """The store's location, or None where history is off (LOADGEN_HISTORY=off)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    chosen = env.get("LOADGEN_HISTORY")
    if chosen:
        return None if chosen == OFF else location(chosen)
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "loadgen" / "history.sqlite"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def workload_hash(config: dict[str, Any]) -> str:
    """What was asked of the server: the config's workload, prompt, n_predict, api and stream, and an open
    loop's mode (levels of req/s are not levels of users; a closed loop's hash is as before it)."""
    asked = {k: config.get(k) for k in ("workload", "prompt", "n_predict", "api", "stream")}
    if config.get("mode") == "rate":
        asked["mode"] = "rate"
    return _digest(asked)


def _pick(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def machine_facts(env: Any) -> dict[str, Any]:
    """The machine fingerprint's key facts (run.json's `environment`): what a like-for-like comparison needs."""
    if not isinstance(env, dict):
        return {}
    cpu, mem = env.get("cpu") or {}, env.get("memory") or {}
    return {"os": env.get("os"), "kernel": env.get("kernel"), "cpu": cpu.get("model"),
            "logical_cores": cpu.get("logical_cores"), "memory_mib": mem.get("total_mib"),
            "gpus": [g.get("name") for g in env.get("gpus") or [] if isinstance(g, dict)]}


def machine_hash(env: Any) -> str | None:
    facts = machine_facts(env)
    return _digest(facts) if facts else None


def level_rows(doc: dict[str, Any], folder: str, fingerprints: Mapping[str, str | None] | None = None
               ) -> list[dict[str, Any]]:
    """The rows of one run document (run.json), one per target and level (a pure function);
    `fingerprints`: a model path -> its content fingerprint (results/model_fingerprint.py)."""
    config = doc.get("config") or {}
    env = doc.get("environment")
    boots: dict[str, Any] = env["boot"] if isinstance(env, dict) and isinstance(env.get("boot"), dict) else {}
    common = {"folder": folder, "started_utc": doc.get("started_utc"), "kind": doc.get("kind"),
              "loadgen_version": doc.get("loadgen_version"), "workload_hash": workload_hash(config),
              "machine_hash": machine_hash(env)}
    rows = []
    for t in doc.get("targets") or []:
        server: dict[str, Any] = t.get("server") or {}
        props: dict[str, Any] = server["props"] if isinstance(server.get("props"), dict) else server
        model_path = props.get("model_path") or server.get("model_path")
        size = props.get("model_size") or server.get("model_size")
        boot: Any = boots.get(t.get("label"))
        flags = (" ".join(map(str, boot["flags"])) if isinstance(boot, dict) and isinstance(boot.get("flags"), list)
                 else None)
        for lv in t.get("levels") or []:
            rows.append({**common, "label": t.get("label"), "server_flags": flags,
                         "model_fingerprint": (fingerprints or {}).get(model_path) if model_path else None,
                         "build_info": props.get("build_info") or server.get("build_info"),
                         "model": Path(model_path).name if model_path else None,
                         "model_size": size if isinstance(size, int) else None,
                         "level": lv.get("level"), "rate": lv.get("rate"),
                         "throughput_tok_s": lv.get("throughput_tok_s"), "request_rate": lv.get("request_rate"),
                         "latency_ms_p50": _pick(lv, "latency_ms", "p50"),
                         "latency_ms_p99": _pick(lv, "latency_ms", "p99"),
                         "ttft_ms_p50": _pick(lv, "ttft_ms", "p50"), "ttft_ms_p99": _pick(lv, "ttft_ms", "p99"),
                         "requests_ok": lv.get("requests_ok"), "requests_failed": lv.get("requests_failed")})
    return rows


class _Db:
    """One connection to a store, SQLite's or PostgreSQL's, speaking the SQL of this module: `?`
    placeholders, one transaction per `transaction()`, the database's errors as HistoryError."""

    def __init__(self, conn: Any, dialect: str, errors: tuple[type[BaseException], ...]):
        self.conn, self.dialect, self.errors = conn, dialect, errors

    def execute(self, sql: str, args: Any = ()) -> Any:
        try:
            return self.conn.execute(sql if self.dialect == "sqlite" else sql.replace("?", "%s"), args)
        except self.errors as exc:
            raise HistoryError(str(exc).strip().splitlines()[0]) from None

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        try:
            if self.dialect == "sqlite":
                self.conn.executemany(sql, rows)
            else:
                self.conn.cursor().executemany(sql.replace("?", "%s"), rows)
        except self.errors as exc:
            raise HistoryError(str(exc).strip().splitlines()[0]) from None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.execute("BEGIN IMMEDIATE" if self.dialect == "sqlite" else "BEGIN")
        try:
            yield
        except BaseException:
            try:
                self.execute("ROLLBACK")
            except HistoryError:
                pass
            raise
        self.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


@contextmanager
def _open(where: Location) -> Iterator[_Db]:
    """The store at `where`, its tables made on first use; closed after."""
    if isinstance(where, str):
        from .history_postgres import connect_postgres

        db = _Db(*connect_postgres(where, SCHEMA_VERSION, (_RUNS, _LEVELS), MIGRATIONS, HistoryError))
    else:
        db = _connect_sqlite(where)
    try:
        yield db
    finally:
        db.close()


def _connect_sqlite(path: Path) -> _Db:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    except sqlite3.Error as exc:
        raise HistoryError(str(exc)) from None
    db = _Db(conn, "sqlite", (sqlite3.Error,))
    try:
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA journal_mode = WAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            with db.transaction():
                db.execute(_RUNS)
                db.execute(_LEVELS)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version < SCHEMA_VERSION:
            with db.transaction():
                if db.execute("PRAGMA user_version").fetchone()[0] == version:  # not migrated meanwhile
                    for step in range(version, SCHEMA_VERSION):
                        for statement in MIGRATIONS[step]:
                            db.execute(statement)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise HistoryError(f"schema_version {version}, this loadgen reads {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return db


def model_paths(doc: dict[str, Any]) -> set[str]:
    """The model files a run's targets served (their /props model_path)."""
    out = set()
    for t in doc.get("targets") or []:
        server = t.get("server") if isinstance(t.get("server"), dict) else {}
        props = server["props"] if isinstance(server.get("props"), dict) else server
        path = props.get("model_path") or server.get("model_path")
        if isinstance(path, str) and path:
            out.add(path)
    return out


def append(where: Location, doc: dict[str, Any], folder: str) -> int:
    """Add one run and its levels in one transaction, with the content fingerprint of each model file
    this machine can read; returns the number of level rows."""
    from .model_fingerprint import model_fingerprint

    rows = level_rows(doc, folder, {path: model_fingerprint(path) for path in model_paths(doc)})
    machine = machine_facts(doc.get("environment"))
    with _open(where) as db, db.transaction():
        run_id = db.execute(
            "INSERT INTO runs (folder, started_utc, finished_utc, kind, loadgen_version, workload_hash,"
            " machine_hash, machine, complete) VALUES (?,?,?,?,?,?,?,?,?) RETURNING run_id",
            (folder, doc.get("started_utc"), doc.get("finished_utc"), doc.get("kind"), doc.get("loadgen_version"),
             workload_hash(doc.get("config") or {}), (rows[0]["machine_hash"] if rows else None),
             json.dumps(machine, sort_keys=True, default=str) if machine else None,
             int(bool(doc.get("complete"))))).fetchone()[0]
        if rows:
            db.executemany(f"INSERT INTO levels ({', '.join(LEVEL_COLUMNS)}) VALUES "
                           f"({', '.join('?' * len(LEVEL_COLUMNS))})",
                           [tuple({**r, "run_id": run_id}[c] for c in LEVEL_COLUMNS) for r in rows])
    return len(rows)


def append_run(doc: dict[str, Any], folder: Path, where: Location | None = None) -> None:
    """Record a finished run in the store; never raises: a store it cannot write costs one warning line."""
    if doc.get("kind") not in LEVEL_KINDS:
        return
    where = default_path() if where is None else where
    if where is None:
        return
    try:
        append(where, doc, str(Path(folder).resolve()))
    except (HistoryError, OSError, ValueError) as exc:
        print(f"warning: the run was not added to the history {shown(where)} ({exc})", file=sys.stderr)


def shown(where: Location) -> str:
    """The store's location for a message: a URL without its password."""
    if isinstance(where, str) and "@" in where:
        scheme, _, rest = where.partition("://")
        user, _, host = rest.rpartition("@")
        return f"{scheme}://{user.split(':', 1)[0]}@{host}"
    return str(where)


# `runs`' filters: a filter's name -> the column it compares and how (a date bound compares the start).
RUN_FILTERS = {"kind": ("r.kind", "="), "label": ("l.label", "="), "model": ("l.model", "="),
               "build": ("l.build_info", "="), "machine": ("r.machine_hash", "="),
               "workload": ("r.workload_hash", "="), "since": ("r.started_utc", ">="), "until": ("r.started_utc", "<")}


def runs(where: Location, last: int | None = None, **filters: str | None) -> list[dict[str, Any]]:
    """The runs newest first, one row per run and target: levels and best throughput, and the identity's
    hashes. `filters` (RUN_FILTERS: kind, label, model, build, machine, workload, since, until) keep the
    rows that match each one given; a date is compared as text, so "2026-12" keeps December's runs on."""
    unknown = sorted(set(filters) - set(RUN_FILTERS))
    if unknown:
        raise ValueError(f"unknown filter {unknown[0]!r}")
    given = [(RUN_FILTERS[k], v) for k, v in filters.items() if v]
    where_sql = [f"{column} {op} ?" for (column, op), _ in given]
    args = [v for _, v in given]
    sql = ("SELECT r.run_id, r.started_utc, r.kind, l.label, MAX(l.build_info) AS build_info, MAX(l.model) AS model,"
           " COUNT(*) AS levels, MAX(l.throughput_tok_s) AS best_throughput_tok_s, r.folder,"
           " r.machine_hash, r.workload_hash FROM runs r JOIN levels l"
           " ON l.run_id = r.run_id" + (" WHERE " + " AND ".join(where_sql) if where_sql else "")
           + " GROUP BY r.run_id, r.started_utc, r.kind, r.folder, r.machine_hash, r.workload_hash, l.label"
           " ORDER BY r.started_utc DESC, r.run_id DESC, l.label")
    if last:
        sql += f" LIMIT {int(last)}"
    with _open(where) as db:
        cur = db.execute(sql, args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def identities(where: Location) -> list[RunIdentity]:
    """Every run and target in the store with its identity (analysis/history_check.py), oldest first."""
    with _open(where) as db:
        cur = db.execute(
            "SELECT r.run_id, r.started_utc, r.folder, l.label, r.kind, MAX(l.model), MAX(l.model_size),"
            " r.workload_hash, r.machine_hash, MAX(l.server_flags), MAX(l.model_fingerprint) FROM runs r JOIN levels l"
            " ON l.run_id = r.run_id"
            " GROUP BY r.run_id, r.started_utc, r.folder, l.label, r.kind, r.workload_hash, r.machine_hash"
            " ORDER BY r.started_utc, r.run_id, l.label")
        return [RunIdentity(run_id=row[0], started_utc=row[1] or "", folder=row[2], label=row[3], kind=row[4],
                            model=row[5], model_size=row[6], workload_hash=row[7], machine_hash=row[8],
                            server_flags=row[9], model_fingerprint=row[10]) for row in cur.fetchall()]


def import_folder(where: Location, folder: Path) -> int:
    """Add an existing run folder's run.json to the store (`loadgen history import`); the level rows
    added. ValueError (one line) when the folder holds no readable run of a kind with levels."""
    try:
        doc = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: no readable run.json ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind", "sweep") not in LEVEL_KINDS:
        raise ValueError(f"{folder}: a run without levels ({doc.get('kind') if isinstance(doc, dict) else '?'}) "
                         "has no rows for the history")
    path = str(folder.resolve())
    if exists(where):
        started = doc.get("started_utc")
        with _open(where) as db:
            known = db.execute("SELECT 1 FROM runs WHERE folder = ? AND started_utc " +
                               ("= ?" if started is not None else "IS NULL"),
                               (path, started) if started is not None else (path,)).fetchone()
        if known:  # the same run twice would look like two runs that agree perfectly
            return 0
    return append(where, doc, path)


def trend_rows(where: Location, figure: str, label: str | None = None) -> list[TrendRow]:
    """Every level row of `label` (every label when None) with its run's identity and `figure`
    (analysis/history_trend.py FIGURES), oldest first."""
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r} (use {', '.join(FIGURES)})")
    sql = ("SELECT r.run_id, r.started_utc, r.folder, l.label, r.kind, l.model, l.model_size, r.workload_hash,"
           f" r.machine_hash, l.build_info, l.level, l.rate, l.{figure}, l.server_flags, l.model_fingerprint"
           " FROM runs r JOIN levels l"
           " ON l.run_id = r.run_id" + (" WHERE l.label = ?" if label is not None else "")
           + " ORDER BY r.started_utc, r.run_id, l.label, COALESCE(l.level, l.rate)")
    with _open(where) as db:
        cur = db.execute(sql, (label,) if label is not None else ())
        return [TrendRow(RunIdentity(run_id=row[0], started_utc=row[1] or "", folder=row[2], label=row[3],
                                     kind=row[4], model=row[5], model_size=row[6], workload_hash=row[7],
                                     machine_hash=row[8], server_flags=row[13], model_fingerprint=row[14]), row[9],
                         row[10] if row[10] is not None else row[11], row[12]) for row in cur.fetchall()]
