"""The history store on PostgreSQL (`--history postgresql://...`, $LOADGEN_HISTORY): a team's one store
for many machines, with the tables and SQL of results/history.py.

psycopg 3 is the optional extra `loadgen[postgres]` (`psycopg[binary]`: its wheel carries libpq). The
tables get PostgreSQL's types for SQLite's (a 64-bit key that numbers itself, DOUBLE PRECISION for
REAL, BIGINT for INTEGER: a model file's size passes 2^31), and are made on first use under an
advisory lock, so two runs opening a new database at once do not race to create them. The schema's
version lives in a one-row table (SQLite keeps it in `PRAGMA user_version`); an older store gets
results/history.py's migrations under the same lock.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

ADVISORY_LOCK = 0x6C6F6164  # "load": the key that serialises making the tables
CONNECT_TIMEOUT_S = 10


def postgres_ddl(sql: str) -> str:
    """A CREATE TABLE of results/history.py in PostgreSQL's types."""
    sql = sql.replace("INTEGER PRIMARY KEY", "BIGSERIAL PRIMARY KEY")
    sql = re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)
    return re.sub(r"\bINTEGER\b", "BIGINT", sql)


def connect_postgres(url: str, schema_version: int, tables: Sequence[str], migrations: Mapping[int, Sequence[str]],
                     error: type[Exception]) -> tuple[Any, str, tuple[type, ...]]:
    """(connection, "postgres", the driver's errors) for results/history.py's `_Db`; the tables made
    when missing; `error` (results/history.py's HistoryError, given: this module imports nothing of it)
    when the driver is missing, the server cannot be reached, or the store is of another schema
    version."""
    try:
        import psycopg
    except ImportError:
        raise error("a PostgreSQL history needs psycopg: pip install 'loadgen[postgres]'") from None
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise error(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__) from None
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (ADVISORY_LOCK,))
            conn.execute("CREATE TABLE IF NOT EXISTS loadgen_history_schema (schema_version INTEGER NOT NULL)")
            row = conn.execute("SELECT schema_version FROM loadgen_history_schema").fetchone()
            if row is None:
                for table in tables:
                    conn.execute(postgres_ddl(table))
                conn.execute("INSERT INTO loadgen_history_schema VALUES (%s)", (schema_version,))
            elif row[0] < schema_version:  # an older store: its migrations, under the same lock
                for step in range(row[0], schema_version):
                    for statement in migrations[step]:
                        conn.execute(statement)
                conn.execute("UPDATE loadgen_history_schema SET schema_version = %s", (schema_version,))
            elif row[0] != schema_version:
                raise error(f"schema_version {row[0]}, this loadgen reads {schema_version}")
    except psycopg.Error as exc:
        conn.close()
        raise error(str(exc).strip().splitlines()[0]) from None
    except BaseException:
        conn.close()
        raise
    return conn, "postgres", (psycopg.Error,)
