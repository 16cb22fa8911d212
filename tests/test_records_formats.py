"""The same run recorded as JSON lines and as Parquet reads back the same: the records, and what
`analyze`, `compare` and `gate` say of it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from loadgen.results.reader import load_records
from servers import LOADGEN, InstantServer

pytest.importorskip("pyarrow", reason="pip install 'loadgen[parquet]' (the dev extra has it)")


def _loadgen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, *args], capture_output=True, text=True, timeout=300)


def _twin_in_parquet(run, twin):
    """`run` with its records exported to Parquet and its JSON lines gone."""
    twin.mkdir()
    for name in ("run.json", "probe.jsonl"):
        shutil.copy(run / name, twin / name)
    done = _loadgen("export", str(run), "--format", "parquet", "--output", str(twin))
    assert done.returncode == 0, done.stderr
    assert (twin / "requests.parquet").is_file() and not (twin / "requests.jsonl").exists()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two sweeps of the instant server (baseline, candidate), each also as a Parquet twin."""
    base = tmp_path_factory.mktemp("formats")
    with InstantServer() as server:
        for name in ("a", "b"):
            done = _loadgen("sweep", "--url", server.url, "--concurrency", "1,4", "--requests", "300",
                            "--warmup", "0", "--output", str(base / name))
            assert done.returncode == 0, done.stderr
    for name in ("a", "b"):
        _twin_in_parquet(base / name, base / f"{name}-parquet")
    return base


def test_the_records_read_back_the_same(runs):
    jsonl, parquet = load_records(runs / "a"), load_records(runs / "a-parquet")
    assert len(jsonl) == 600 and parquet == jsonl


@pytest.mark.parametrize("command", [
    ("analyze", "{a}"),
    ("compare", "{a}", "{b}", "--format", "json"),
    ("gate", "{a}", "{b}"),
    ("export", "{a}", "--format", "csv", "--output", "{out}"),
])
def test_analyze_compare_gate_and_export_say_the_same_of_both_formats(runs, tmp_path, command):
    said = []
    for suffix in ("", "-parquet"):
        out = tmp_path / f"out{suffix}"
        args = [c.format(a=runs / f"a{suffix}", b=runs / f"b{suffix}", out=out) for c in command]
        done = _loadgen(*args)
        assert "Traceback" not in done.stderr
        text = done.stdout
        for name in ("a", "b", "out"):  # paths differ by their suffix only
            text = text.replace(f"{name}{suffix}", name)
        files = {p.name: p.read_bytes() for p in sorted(out.glob("*"))} if out.exists() else {}
        said.append((done.returncode, text, files))
    assert said[0] == said[1]
    assert said[0][1] or said[0][2]  # something was said


def test_a_sweep_writes_parquet_directly_and_exports_it_back_to_json_lines(tmp_path):
    with InstantServer() as server:
        done = _loadgen("sweep", "--url", server.url, "--concurrency", "2", "--requests", "200", "--warmup", "0",
                        "--records-format", "parquet", "--output", str(tmp_path / "p"))
        seen = server.count()
    assert done.returncode == 0, done.stderr
    records = load_records(tmp_path / "p")
    assert len(records) == seen == 200 and not (tmp_path / "p" / "requests.jsonl").exists()
    back = _loadgen("export", str(tmp_path / "p"), "--format", "jsonl", "--output", str(tmp_path / "back"))
    assert back.returncode == 0, back.stderr
    shutil.copy(tmp_path / "p" / "run.json", tmp_path / "back" / "run.json")
    assert load_records(tmp_path / "back") == records
