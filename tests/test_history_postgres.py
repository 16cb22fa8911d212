"""The history store on Debian's PostgreSQL (results/history_postgres.py) gives the same answers as on
SQLite: the same runs appended to both, then every reader of the store and `loadgen history` compared;
two writers at once on a new database both land; a sweep given `--history postgresql://...` adds its
levels; an unreachable server costs the run one warning line."""

from __future__ import annotations

import json
import threading

import pytest

from loadgen.results import history
from servers import SimThread, _missing, postgres_bin, start_postgres


@pytest.fixture(scope="module")
def postgres():
    if postgres_bin() is None:
        _missing("PostgreSQL", "apt-get install -y postgresql")
    server = start_postgres()
    yield server
    server.stop()


def _fresh(postgres, name: str) -> str:
    """A new empty database on the cluster: its URL."""
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return postgres.url.rsplit("/", 1)[0] + f"/{name}"


def _doc(n: int, build: str, tok_s: float, *, model_size: int = 5_000_000_000, label: str = "a") -> dict:
    return {"kind": "sweep", "started_utc": f"2026-12-05T10:{n:02d}:00Z", "loadgen_version": "0.1.0",
            "config": {"n_predict": 8}, "complete": True, "environment": {"cpu": {"model": "x"}},
            "targets": [{"label": label, "server": {"props": {"build_info": build, "model_path": "/m/smol.gguf",
                                                              "model_size": model_size}},
                         "levels": [{"level": c, "throughput_tok_s": tok_s * c, "latency_ms": {"p50": 10.5, "p99": 20.25},
                                     "requests_ok": 4, "requests_failed": 0} for c in (1, 2)]},
                        {"label": "b", "server": {}, "levels": [{"rate": 0.5, "throughput_tok_s": 3.0}]}]}


def test_the_same_runs_give_the_same_answers_on_both_stores(postgres, tmp_path, loadgen):
    url, lite = _fresh(postgres, "same_answers"), tmp_path / "h.sqlite"
    docs = [_doc(1, "b1", 100.0), _doc(2, "b1", 110.0), _doc(3, "b2", 80.0), _doc(4, "b2", 81.5, label="c")]
    for n, doc in enumerate(docs):
        for store in (url, lite):
            assert history.append(store, doc, f"/runs/{n}") == 3
    for reader in (lambda s: history.runs(s), lambda s: history.runs(s, label="a", last=2),
                   lambda s: history.identities(s), lambda s: history.trend_rows(s, "throughput_tok_s"),
                   lambda s: history.trend_rows(s, "latency_ms_p99", "a")):
        assert reader(url) == reader(lite)
    assert history.identities(url)[0].model_size == 5_000_000_000  # past 2^31: BIGINT, not INTEGER
    rates = [r.level for r in history.trend_rows(url, "throughput_tok_s", "b")]
    assert rates == [0.5] * 4  # an open loop's rate where the level is missing
    commands = (("history", "--history", "STORE", "--format", "json"),
                ("history", "trend", "--history", "STORE", "--label", "a", "--level", "2"))
    for command in commands:
        (code_pg, out_pg, err_pg), (code_lite, out_lite, _) = (
            loadgen(*[str(store) if a == "STORE" else a for a in command]) for store in (url, lite))
        assert code_pg == code_lite == 0, err_pg
        assert out_pg.replace(history.shown(url), "STORE") == out_lite.replace(str(lite), "STORE")
    rows = json.loads(loadgen("history", "--history", url, "--format", "json")[1])
    assert [r["label"] for r in rows][:3] == ["b", "c", "a"]  # newest first, then by label


def test_import_skips_a_known_run_on_postgres(postgres, tmp_path):
    url = _fresh(postgres, "imports")
    run = tmp_path / "r"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(_doc(1, "b1", 100.0)))
    assert history.import_folder(url, run) == 3
    assert history.import_folder(url, run) == 0


def test_two_writers_on_a_new_database_both_land(postgres):
    url = _fresh(postgres, "writers")
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(5):
                history.append(url, _doc(i, f"b{n}", 10.0 + n), f"/runs/{n}/{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(history.identities(url)) == 2 * 5 * 2  # runs x targets


def test_a_sweep_adds_its_levels_and_an_unreachable_store_costs_one_line(postgres, loadgen, tmp_path, monkeypatch):
    import os

    # --history reaches a run's children through the environment: set here so the test's end restores it
    monkeypatch.setenv("LOADGEN_HISTORY", os.environ.get("LOADGEN_HISTORY", "off"))
    url = _fresh(postgres, "sweeps")
    pytest.importorskip("psycopg")  # the dev extra installs it
    with SimThread(slots=2) as sim:
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "4", "--n-predict", "8",
                               "--history", url, "--output", str(tmp_path / "run"))
        assert code == 0, err
        assert [r["levels"] for r in history.runs(url)] == [2]
        dead = f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"
        code, _, err = loadgen("sweep", "--url", sim.url, "--concurrency", "1", "--requests", "2", "--n-predict", "8",
                               "--history", dead, "--output", str(tmp_path / "run2"))
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "not added to the history" in line]
    assert len(warnings) == 1 and dead in warnings[0], err


def test_a_password_is_never_shown():
    assert history.shown("postgresql://me:s3cret@db.example:5432/h") == "postgresql://me@db.example:5432/h"
    assert history.shown("postgresql://db.example/h") == "postgresql://db.example/h"


def _closed_port() -> int:
    from servers import free_port

    return free_port()


def test_a_store_of_the_first_schema_is_migrated_on_postgres(postgres):
    import psycopg

    from loadgen.results.history_postgres import postgres_ddl

    url = _fresh(postgres, "first_schema")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(postgres_ddl(history._RUNS))
        conn.execute(postgres_ddl(history._LEVELS.replace(", server_flags TEXT, model_fingerprint TEXT", "")))
        conn.execute("CREATE TABLE loadgen_history_schema (schema_version INTEGER NOT NULL)")
        conn.execute("INSERT INTO loadgen_history_schema VALUES (1)")
    doc = {**_doc(1, "b1", 100.0), "environment": {"boot": {"a": {"flags": ["--parallel", "4"]}}}}
    assert history.append(url, doc, "/runs/1") == 3
    assert {(r.label, r.server_flags) for r in history.identities(url)} == {("a", "--parallel 4"), ("b", None)}
