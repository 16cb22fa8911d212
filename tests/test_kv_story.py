"""`loadgen kv` and `observe` as a new user meets them (issue 39): no extra to install, a table that
is never cut at 120 columns, the padded context labelled for what it is, and contexts beyond the
model's trained one noted. Expected outputs written before the code that gives them."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from servers import LOADGEN
from test_kv import SMOLLM2, write_gguf

ROOT = Path(__file__).resolve().parents[1]


def test_kv_and_observe_need_no_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split(";")[0].strip().lower() for d in project["dependencies"]}
    assert {"gguf", "grafana-foundation-sdk"} <= names


def _kv(*args, columns=120):
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([*LOADGEN, "kv", *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def test_kv_table_is_never_cut_at_120_columns(tmp_path):
    """Before: "--parall…" in the header and "32,768 ×" / "1" on two lines."""
    model = write_gguf(tmp_path / "smollm2.gguf", SMOLLM2)
    proc = _kv(model)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    table = [line for line in lines if line[:1] in "┏┃┡│└"]  # notes stay one line in a pipe, for grep
    assert table and max(map(len, table)) <= 120
    assert "…" not in proc.stdout
    assert "--parallel" in proc.stdout
    assert any("32,768 × 1" in line for line in lines)


def test_the_padded_context_is_labelled(tmp_path):
    """-c 3000 is padded to 3,072 cells: the table shows the flag's value and the padded n_ctx apart."""
    model = write_gguf(tmp_path / "smollm2.gguf", SMOLLM2)
    proc = _kv(model, "-c", "3000", columns=200)
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "3,000" in line)
    assert "3,072" in row
    assert "n_ctx" in proc.stdout and "padded" in proc.stdout


# --ctx -> the note on contexts beyond SmolLM2's trained 8,192 (None: no note)
BEYOND = [
    ("4096", None),
    ("8192", None),
    ("4096,32768,131072", "32,768 and 131,072 are beyond the model's trained context (8,192)"),
    ("16384", "16,384 is beyond the model's trained context (8,192)"),
]


@pytest.mark.parametrize("ctx, note", BEYOND)
def test_contexts_beyond_the_trained_one_are_noted(tmp_path, ctx, note):
    model = write_gguf(tmp_path / "smollm2.gguf", SMOLLM2)
    proc = _kv(model, "--ctx", ctx, columns=200)
    assert proc.returncode == 0, proc.stderr
    if note is None:
        assert "beyond the model's trained context" not in proc.stdout
    else:
        assert note in proc.stdout
