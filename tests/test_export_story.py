"""`loadgen export` as a new user meets it (issue 39): a prefill or depth run exports its table or is
refused in one line; records kept with `--records errors|none` are said to be filtered; nothing is
overwritten without --force; run.json says which records were kept. Expected outputs written first."""

from __future__ import annotations

import csv
import json
import stat
import subprocess

import pytest

from servers import LOADGEN

SMALL = ("--warmup", "0")


def _loadgen(*args):
    return subprocess.run([*LOADGEN, *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from servers import SimProcess

    root = tmp_path_factory.mktemp("runs")
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "0.05") as sim:
        for name, args in (("prefill", ("prefill", "--prompt-tokens", "32,64", "--repeat", "2")),
                           ("depth", ("depth", "--depths", "0,64", "--repeat", "2", "--n-predict", "4")),
                           ("errors", ("sweep", "--concurrency", "1", "--requests", "4", "--n-predict", "4", "--records", "errors")),
                           ("none", ("sweep", "--concurrency", "1", "--requests", "4", "--n-predict", "4", "--records", "none"))):
            proc = _loadgen(*args, "--url", sim.url, *SMALL, "--output", root / name)
            assert proc.returncode == 0, proc.stderr
    return root


@pytest.mark.parametrize("kind, size", [("prefill", "prompt_tokens"), ("depth", "depth")])
def test_a_mode_run_exports_its_table(runs, tmp_path, kind, size):
    """Before: a header-only levels.csv and "levels": [] (exit 0). After: the run's own rows."""
    proc = _loadgen("export", runs / kind, "--format", "csv", "--out", tmp_path / "csv")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((tmp_path / "csv" / f"{kind}.csv").open()))
    assert [int(r[size]) for r in rows] == ([32, 64] if kind == "prefill" else [0, 64])
    assert all(r["requests_ok"] == "2" for r in rows)
    assert not (tmp_path / "csv" / "levels.csv").exists()
    proc = _loadgen("export", runs / kind, "--format", "json", "--out", tmp_path / "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "json" / f"{kind}.json").read_text())
    assert [r[size] for r in doc["targets"][0]["rows"]] == [int(r[size]) for r in rows]


@pytest.mark.parametrize("fmt", ["hgrm", "hlog"])
def test_a_mode_run_refuses_histograms_in_one_line(runs, tmp_path, fmt):
    """Before: "no successful request has this metric" for a run of 4 successful requests, exit 0."""
    proc = _loadgen("export", runs / "prefill", "--format", fmt, "--out", tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "prefill run" in proc.stderr and "csv" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name, kept", [("errors", "errors"), ("none", "none")])
def test_run_json_says_which_records_were_kept(runs, name, kept):
    assert json.loads((runs / name / "run.json").read_text())["config"]["records"] == kept


def test_filtered_records_are_said(runs, tmp_path):
    proc = _loadgen("export", runs / "errors", "--format", "csv", "--out", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    assert "--records errors" in proc.stderr and "0 of 4 requests" in proc.stderr
    proc = _loadgen("export", runs / "none", "--format", "hgrm", "--out", tmp_path / "b")
    assert proc.returncode == 2 and "--records none" in proc.stderr, proc.stderr


def test_export_never_overwrites_without_force(runs, tmp_path):
    out = tmp_path / "out"
    assert _loadgen("export", runs / "prefill", "--format", "csv", "--out", out).returncode == 0
    (out / "prefill.csv").write_text("edited\n")
    proc = _loadgen("export", runs / "prefill", "--format", "csv", "--out", out)
    assert proc.returncode == 2 and "--force" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (out / "prefill.csv").read_text() == "edited\n"
    proc = _loadgen("export", runs / "prefill", "--format", "csv", "--out", out, "--force")
    assert proc.returncode == 0 and (out / "prefill.csv").read_text() != "edited\n"


def test_results_files_share_one_mode(runs):
    """Before: run.json and probe.jsonl 0600 (a temp file's), requests.jsonl 0644."""
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (runs / "prefill").iterdir()
             if p.name in ("run.json", "probe.jsonl", "requests.jsonl")}
    assert len(modes) == 3 and len(set(modes.values())) == 1, modes
