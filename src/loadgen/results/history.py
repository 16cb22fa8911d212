"""The history store (issue 49, first slice): one SQLite row per target and level of every finished or
stopped run that has levels, beside a small `runs` table, so results can be compared over builds and time.

Where: $LOADGEN_HISTORY (a path, or "off" for none), else $XDG_DATA_HOME/loadgen/history.sqlite, else
~/.local/share/loadgen/history.sqlite. Writers use WAL and a busy timeout and one transaction per run;
a store that cannot be written never costs the run: `append_run` warns in one line and returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..analysis.history_check import RunIdentity
from ..analysis.history_trend import FIGURES, TrendRow

SCHEMA_VERSION = 1
OFF = "off"
BUSY_TIMEOUT_MS = 10_000
LEVEL_KINDS = {"sweep", "demo", "capacity", "replay", "prefix", "chat", "cache-capacity"}

_RUNS = """CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY, folder TEXT NOT NULL, started_utc TEXT, finished_utc TEXT, kind TEXT,
    loadgen_version TEXT, workload_hash TEXT, machine_hash TEXT, machine TEXT, complete INTEGER)"""
_LEVELS = """CREATE TABLE IF NOT EXISTS levels (
    run_id INTEGER NOT NULL REFERENCES runs(run_id), folder TEXT, started_utc TEXT, kind TEXT,
    loadgen_version TEXT, workload_hash TEXT, machine_hash TEXT, label TEXT, build_info TEXT,
    model TEXT, model_size INTEGER, level INTEGER, rate REAL, throughput_tok_s REAL, request_rate REAL,
    latency_ms_p50 REAL, latency_ms_p99 REAL, ttft_ms_p50 REAL, ttft_ms_p99 REAL,
    requests_ok INTEGER, requests_failed INTEGER)"""
LEVEL_COLUMNS = ("run_id", "folder", "started_utc", "kind", "loadgen_version", "workload_hash", "machine_hash",
                 "label", "build_info", "model", "model_size", "level", "rate", "throughput_tok_s",
                 "request_rate", "latency_ms_p50", "latency_ms_p99", "ttft_ms_p50", "ttft_ms_p99",
                 "requests_ok", "requests_failed")


def default_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """The store's path, or None where history is off (LOADGEN_HISTORY=off)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    chosen = env.get("LOADGEN_HISTORY")
    if chosen:
        return None if chosen == OFF else Path(chosen).expanduser()
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


def level_rows(doc: dict[str, Any], folder: str) -> list[dict[str, Any]]:
    """The rows of one run document (run.json), one per target and level (a pure function)."""
    config = doc.get("config") or {}
    env = doc.get("environment")
    common = {"folder": folder, "started_utc": doc.get("started_utc"), "kind": doc.get("kind"),
              "loadgen_version": doc.get("loadgen_version"), "workload_hash": workload_hash(config),
              "machine_hash": machine_hash(env)}
    rows = []
    for t in doc.get("targets") or []:
        server: dict[str, Any] = t.get("server") or {}
        props: dict[str, Any] = server["props"] if isinstance(server.get("props"), dict) else server
        model_path = props.get("model_path") or server.get("model_path")
        size = props.get("model_size") or server.get("model_size")
        for lv in t.get("levels") or []:
            rows.append({**common, "label": t.get("label"),
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


def connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_RUNS)
        conn.execute(_LEVELS)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    elif version != SCHEMA_VERSION:
        conn.close()
        raise sqlite3.DatabaseError(f"schema_version {version}, this loadgen reads {SCHEMA_VERSION}")
    return conn


def append(path: Path, doc: dict[str, Any], folder: str) -> int:
    """Add one run and its levels in one transaction; returns the number of level rows."""
    rows = level_rows(doc, folder)
    machine = machine_facts(doc.get("environment"))
    conn = connect(path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(
            "INSERT INTO runs (folder, started_utc, finished_utc, kind, loadgen_version, workload_hash,"
            " machine_hash, machine, complete) VALUES (?,?,?,?,?,?,?,?,?)",
            (folder, doc.get("started_utc"), doc.get("finished_utc"), doc.get("kind"), doc.get("loadgen_version"),
             workload_hash(doc.get("config") or {}), (rows[0]["machine_hash"] if rows else None),
             json.dumps(machine, sort_keys=True, default=str) if machine else None, int(bool(doc.get("complete")))))
        run_id = cur.lastrowid
        conn.executemany(f"INSERT INTO levels ({', '.join(LEVEL_COLUMNS)}) VALUES ({', '.join('?' * len(LEVEL_COLUMNS))})",
                         [tuple({**r, "run_id": run_id}[c] for c in LEVEL_COLUMNS) for r in rows])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()
    return len(rows)


def append_run(doc: dict[str, Any], folder: Path, path: Path | None = None) -> None:
    """Record a finished run in the store; never raises: a store it cannot write costs one warning line."""
    if doc.get("kind") not in LEVEL_KINDS:
        return
    path = default_path() if path is None else path
    if path is None:
        return
    try:
        append(path, doc, str(Path(folder).resolve()))
    except (sqlite3.Error, OSError, ValueError) as exc:
        print(f"warning: the run was not added to the history {path} ({exc})", file=sys.stderr)


def runs(path: Path, kind: str | None = None, label: str | None = None, last: int | None = None) -> list[dict[str, Any]]:
    """The runs newest first, one row per run and target: levels and best throughput."""
    conn = connect(path)
    try:
        where, args = [], []
        if kind:
            where.append("r.kind = ?")
            args.append(kind)
        if label:
            where.append("l.label = ?")
            args.append(label)
        sql = ("SELECT r.run_id, r.started_utc, r.kind, l.label, l.build_info, l.model, COUNT(*) AS levels,"
               " MAX(l.throughput_tok_s) AS best_throughput_tok_s, r.folder FROM runs r JOIN levels l"
               " ON l.run_id = r.run_id" + (" WHERE " + " AND ".join(where) if where else "")
               + " GROUP BY r.run_id, l.label ORDER BY r.started_utc DESC, r.run_id DESC")
        if last:
            sql += f" LIMIT {int(last)}"
        cur = conn.execute(sql, args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        conn.close()


def identities(path: Path) -> list[RunIdentity]:
    """Every run and target in the store with its identity (analysis/history_check.py), oldest first."""
    conn = connect(path)
    try:
        cur = conn.execute(
            "SELECT r.run_id, r.started_utc, r.folder, l.label, r.kind, MAX(l.model), MAX(l.model_size),"
            " r.workload_hash, r.machine_hash FROM runs r JOIN levels l ON l.run_id = r.run_id"
            " GROUP BY r.run_id, l.label ORDER BY r.started_utc, r.run_id")
        return [RunIdentity(run_id=row[0], started_utc=row[1] or "", folder=row[2], label=row[3], kind=row[4],
                            model=row[5], model_size=row[6], workload_hash=row[7], machine_hash=row[8])
                for row in cur.fetchall()]
    finally:
        conn.close()


def import_folder(path: Path, folder: Path) -> int:
    """Add an existing run folder's run.json to the store (`loadgen history import`); the level rows
    added. ValueError (one line) when the folder holds no readable run of a kind with levels."""
    try:
        doc = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: no readable run.json ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind", "sweep") not in LEVEL_KINDS:
        raise ValueError(f"{folder}: a run without levels ({doc.get('kind') if isinstance(doc, dict) else '?'}) "
                         "has no rows for the history")
    where = str(folder.resolve())
    if path.exists():
        conn = connect(path)
        try:
            known = conn.execute("SELECT 1 FROM runs WHERE folder = ? AND started_utc IS ?",
                                 (where, doc.get("started_utc"))).fetchone()
        finally:
            conn.close()
        if known:  # the same run twice would look like two runs that agree perfectly
            return 0
    return append(path, doc, where)


def trend_rows(path: Path, figure: str, label: str | None = None) -> list[TrendRow]:
    """Every level row of `label` (every label when None) with its run's identity and `figure`
    (analysis/history_trend.py FIGURES), oldest first."""
    if figure not in FIGURES:
        raise ValueError(f"unknown figure {figure!r} (use {', '.join(FIGURES)})")
    conn = connect(path)
    try:
        sql = ("SELECT r.run_id, r.started_utc, r.folder, l.label, r.kind, l.model, l.model_size, r.workload_hash,"
               f" r.machine_hash, l.build_info, COALESCE(l.level, l.rate), l.{figure} FROM runs r JOIN levels l"
               " ON l.run_id = r.run_id" + (" WHERE l.label = ?" if label is not None else "")
               + " ORDER BY r.started_utc, r.run_id")
        cur = conn.execute(sql, (label,) if label is not None else ())
        return [TrendRow(RunIdentity(run_id=row[0], started_utc=row[1] or "", folder=row[2], label=row[3],
                                     kind=row[4], model=row[5], model_size=row[6], workload_hash=row[7],
                                     machine_hash=row[8]), row[9], row[10], row[11]) for row in cur.fetchall()]
    finally:
        conn.close()
