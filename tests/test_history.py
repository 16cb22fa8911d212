"""The history store (results/history.py, docs/history.md): rows from real sweeps, checkpoints left out,
concurrent writers, a damaged store that never costs the run, --no-history, and `loadgen history`."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from loadgen.results import history
from loadgen.results.reader import load_run_dict
from servers import SimThread


def _rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM levels ORDER BY run_id, label, level")]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def sim():
    with SimThread(slots=4) as s:
        yield s


def _sweep(cli, sim, out: Path, *extra: str) -> tuple[int, str, str]:
    return cli("sweep", "--url", sim.url, "--concurrency", "1,2", "--requests", "4", "--n-predict", "8",
               "--output", str(out), *extra)


@pytest.mark.parametrize(("env", "expected"), [
    ({"LOADGEN_HISTORY": "/x/h.sqlite"}, Path("/x/h.sqlite")),
    ({"LOADGEN_HISTORY": "off"}, None),
    ({"XDG_DATA_HOME": "/d"}, Path("/d/loadgen/history.sqlite")),
    ({}, Path.home() / ".local/share/loadgen/history.sqlite"),
])
def test_where_the_store_lives(env, expected):
    assert history.default_path(env) == expected


def test_a_sweep_appends_one_row_per_level_with_its_identity(loadgen, sim, tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite"
    monkeypatch.setenv("LOADGEN_HISTORY", str(tmp_path / "unused.sqlite"))
    code, _, err = _sweep(loadgen, sim, tmp_path / "run", "--history", str(db))
    assert code == 0, err
    doc = load_run_dict(tmp_path / "run")
    rows = _rows(db)
    assert [r["level"] for r in rows] == [1, 2]
    levels = doc["targets"][0]["levels"]
    for row, lv in zip(rows, levels, strict=True):
        assert row["throughput_tok_s"] == pytest.approx(lv["throughput_tok_s"])
        assert row["latency_ms_p99"] == pytest.approx(lv["latency_ms"]["p99"])
        assert row["requests_ok"] == lv["requests_ok"]
    server = doc["targets"][0]["server"]["props"]
    assert rows[0]["build_info"] == server["build_info"]
    assert rows[0]["model"] == Path(server["model_path"]).name
    assert rows[0]["kind"] == "sweep" and rows[0]["folder"] == str((tmp_path / "run").resolve())
    assert rows[0]["machine_hash"] and rows[0]["workload_hash"] == history.workload_hash(doc["config"])
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION
    assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1  # the checkpoints added nothing
    assert not (tmp_path / "unused.sqlite").exists()


def test_no_history_writes_nothing(loadgen, sim, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADGEN_HISTORY", str(tmp_path / "h.sqlite"))
    code, _, err = _sweep(loadgen, sim, tmp_path / "run", "--no-history")
    assert code == 0, err
    assert not (tmp_path / "h.sqlite").exists()


def test_a_corrupt_store_warns_once_and_the_run_stands(loadgen, sim, tmp_path, monkeypatch):
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"this is not a database" * 100)
    monkeypatch.setenv("LOADGEN_HISTORY", str(db))
    code, _, err = _sweep(loadgen, sim, tmp_path / "run")
    assert code == 0, err
    warnings = [line for line in err.splitlines() if "history" in line and "warning" in line]
    assert len(warnings) == 1, err
    assert load_run_dict(tmp_path / "run")["complete"] is True


def test_checkpoint_writes_do_not_append(tmp_path, monkeypatch):
    from loadgen.results import writer

    calls = []
    monkeypatch.setattr(writer, "append_run", lambda doc, folder: calls.append(doc))
    monkeypatch.setattr(writer, "write_results", lambda *a, **k: {"kind": "sweep", "final": k.get("final", True)})
    files = writer.RunFiles(tmp_path)
    files.checkpoint(None)  # type: ignore[arg-type]
    assert calls == []
    files.final(None)  # type: ignore[arg-type]
    assert len(calls) == 1


def _doc(n: int) -> dict:
    return {"kind": "sweep", "started_utc": f"2026-01-01T00:00:{n:02d}", "loadgen_version": "0",
            "config": {"n_predict": 8}, "complete": True,
            "targets": [{"label": f"t{n}", "server": {"props": {"build_info": f"b{n}"}},
                         "levels": [{"level": c, "throughput_tok_s": 10.0 * c} for c in (1, 2, 4)]}]}


def test_concurrent_writers_all_land(tmp_path):
    db = tmp_path / "h.sqlite"
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            for i in range(5):
                history.append(db, _doc(n * 10 + i), f"/runs/{n}/{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(_rows(db)) == 4 * 5 * 3


def test_non_level_kinds_are_not_recorded(tmp_path):
    db = tmp_path / "h.sqlite"
    history.append_run({**_doc(1), "kind": "soak"}, tmp_path, db)
    assert not db.exists()


def test_history_lists_and_filters(loadgen, tmp_path):
    db = tmp_path / "h.sqlite"
    for n in range(3):
        history.append(db, _doc(n), f"/runs/{n}")
    history.append(db, {**_doc(3), "kind": "capacity"}, "/runs/3")
    code, out, err = loadgen("history", "--history", db, "--format", "json")
    assert code == 0, err
    rows = json.loads(out)
    assert [r["label"] for r in rows] == ["t3", "t2", "t1", "t0"]  # newest first
    assert rows[0]["levels"] == 3 and rows[0]["best_throughput_tok_s"] == 40.0
    code, out, _ = loadgen("history", "--history", db, "--format", "json", "--kind", "capacity")
    assert [r["folder"] for r in json.loads(out)] == ["/runs/3"]
    code, out, _ = loadgen("history", "--history", db, "--format", "json", "--label", "t1")
    assert [r["build_info"] for r in json.loads(out)] == ["b1"]
    code, out, _ = loadgen("history", "--history", db, "--format", "json", "--last", "2")
    assert len(json.loads(out)) == 2
    for flags, labels in ((("--build", "b2"), ["t2"]), (("--since", "2026-01-01T00:00:02"), ["t3", "t2"]),
                          (("--until", "2026-01-01T00:00:01"), ["t0"]), (("--model", "none.gguf"), []),
                          (("--kind", "sweep", "--since", "2026-01-01T00:00:01", "--until", "2026-01-01T00:00:03"),
                           ["t2", "t1"])):
        code, out, err = loadgen("history", "--history", db, "--format", "json", *flags)
        assert code == 0 and [r["label"] for r in json.loads(out)] == labels, (flags, err)
    workload = rows[0]["workload_hash"]
    code, out, _ = loadgen("history", "--history", db, "--format", "json", "--workload", workload)
    assert len(json.loads(out)) == 4  # one workload for all four
    code, out, _ = loadgen("history", "--history", db)
    assert code == 0 and "b3" in out
    code, _, err = loadgen("history", "--history", tmp_path / "none.sqlite")
    assert code == 2 and "no history" in err


@pytest.mark.parametrize("damage", ["garbage", "directory", "newer_schema"])
def test_a_store_it_cannot_write_costs_one_warning_line(tmp_path, capsys, damage):
    db = tmp_path / "h.sqlite"
    if damage == "garbage":
        db.write_bytes(b"\x00\xffnot sqlite" * 50)
    elif damage == "directory":
        db.mkdir()
    else:
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA user_version = 99")
        conn.close()
    history.append_run(_doc(1), tmp_path, db)  # never raises
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("warning: the run was not added to the history")


def test_a_store_of_the_first_schema_is_migrated_and_keeps_its_rows(tmp_path):
    """A version-1 store (before `server_flags`): opened by this loadgen, its rows stay, new rows carry
    the flags of a server loadgen started (run.json's environment.boot), and identities read both."""
    db = tmp_path / "h.sqlite"
    conn = sqlite3.connect(db)
    conn.execute(history._RUNS)
    conn.execute(history._LEVELS.replace(", server_flags TEXT, model_fingerprint TEXT", ""))
    conn.execute("INSERT INTO runs (run_id, folder, started_utc, kind) VALUES (1, '/r/0', '2026-01-01T00:00:00', 'sweep')")
    conn.execute("INSERT INTO levels (run_id, label, level, throughput_tok_s) VALUES (1, 't0', 1, 10.0)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    doc = {**_doc(1), "environment": {"boot": {"t1": {"flags": ["-m", "m.gguf", "--parallel", "4"]}}}}
    assert history.append(db, doc, "/r/1") == 3
    got = {(r.label, r.server_flags) for r in history.identities(db)}
    assert got == {("t0", None), ("t1", "-m m.gguf --parallel 4")}
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == history.SCHEMA_VERSION == 2
