"""grid.json damaged anywhere (a node replaced by any JSON value, a field removed, the bytes cut or
replaced): `analyze`, `report` and `grid --resume` end with one line and exit 2, never a traceback.

The grid here is written by hand in the shape `loadgen grid` writes (two cells, each one finished
run whose folder is the sweep fixture, one failed run); its template names a program that does not
exist, so a `--resume` that finds work left fails at once instead of starting anything.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadgen.core.errors import ResultsError
from loadgen.results.grid_file import load_grid
from servers import run_cli
from test_results_fuzz import FIXTURE, FUZZ, assert_clean, json_values

TEMPLATE = "loadgen-fuzz-no-such-server -np {parallel} -c 2048"


def _run(repeat: int, cell: str, status: str = "ok") -> dict:
    entry = {"repeat": repeat, "started_utc": "2026-12-01T10:00:00+00:00", "command": ["x"], "url": "http://x",
             "log": f"cells/{cell}/r{repeat}/server.log", "kv_estimate": {"kv_mib": 45.0, "n_ctx": 2048},
             "kv_estimate_note": None, "status": status}
    if status == "ok":
        entry.update(run_dir=f"cells/{cell}/r{repeat}/run", pid=1, measure_exit=0, server_exit=0, server_gone=True,
                     boot={"n_slots": 2, "kv_unified": False, "kv_size_mib": 45.0, "kv_caches": []},
                     props={"total_slots": 2})
    else:
        entry.update(reason="the server exited with code 1 before it was healthy", log_tail=["error: [/bad]"])
    return entry


GOOD = {"schema": "loadgen.grid", "schema_version": 1, "command": "loadgen grid ...", "template": TEMPLATE,
        "params": [{"name": "parallel", "values": ["1", "2"]}], "repeat": 2, "measure": "sweep",
        "measure_args": ["--concurrency", "1,2", "--requests", "4"], "wait_ready_s": 600,
        "cells": [{"id": "c01", "name": "parallel=1", "params": {"parallel": "1"},
                   "runs": [_run(1, "c01"), _run(2, "c01", "failed")]},
                  {"id": "c02", "name": "parallel=2", "params": {"parallel": "2"},
                   "runs": [_run(1, "c02"), _run(2, "c02")]}]}

COMMANDS = {
    "analyze": lambda grid: ["analyze", grid],
    "report": lambda grid: ["report", grid, "--format", "markdown"],
    "resume": lambda grid: ["grid", "--resume", grid],
}


@pytest.fixture(scope="module")
def grid_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("grid")
    for cell in GOOD["cells"]:
        for entry in cell["runs"]:
            if entry.get("run_dir"):
                shutil.copytree(FIXTURE, root / entry["run_dir"])
    return root


def write(root: Path, doc: object) -> None:
    (root / "grid.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_undamaged_grid_reads(grid_dir, command):
    write(grid_dir, GOOD)
    code, out, err = run_cli(*COMMANDS[command](grid_dir))
    assert code == (1 if command == "resume" else 0), err  # resume: nothing left to run, one run had failed
    assert ("c01 r1" if command == "report" else "parallel") in out


def _without(path: tuple, doc: dict | None = None) -> dict:
    doc = json.loads(json.dumps(GOOD)) if doc is None else doc
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return doc


def _with(path: tuple, value: object) -> dict:
    doc = json.loads(json.dumps(GOOD))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


# The field report's kinds of damage, and the reason each is told (written down before the fix).
DAMAGED = [
    ("cells missing", _without(("cells",)), "missing required field `cells`"),
    ("repeat a string", _with(("repeat",), "2"), "Expected `int`, got `str` - at `$.repeat`"),
    ("repeat 0", _with(("repeat",), 0), "Expected `int` >= 1 - at `$.repeat`"),
    ("a run's repeat missing", _without(("cells", 0, "runs", 0, "repeat")), "at `$.cells[0].runs[0]`"),
    ("a run's status a number", _with(("cells", 1, "runs", 0, "status"), 3), "at `$.cells[1].runs[0].status`"),
    ("run_dir a list", _with(("cells", 0, "runs", 0, "run_dir"), ["x"]), "at `$.cells[0].runs[0].run_dir`"),
    ("boot slots a string", _with(("cells", 0, "runs", 0, "boot", "n_slots"), "2"), "boot.n_slots`"),
    ("kv estimate a string", _with(("cells", 0, "runs", 0, "kv_estimate"), "45"), "kv_estimate`"),
    ("a cell's params a list", _with(("cells", 0, "params"), ["1"]), "at `$.cells[0].params`"),
    ("a cell id that leaves cells/", _with(("cells", 0, "id"), "../.."), "at `$.cells[0].id`"),
    ("a cell id twice", _with(("cells", 1, "id"), "c01"), "cell id 'c01' is given twice"),
    ("a cell without the template's parameter", _with(("cells", 1, "params"), {"p": "2"}),
     "cell c02's parameters ['p'] are not the grid's ['parallel']"),
    ("a template without the placeholder", _with(("template",), "llama-server"), "its template and params do not fit"),
    ("an unknown measurement", _with(("measure",), "bench"), "at `$.measure`"),
    ("wait_ready_s negative", _with(("wait_ready_s",), -1), "at `$.wait_ready_s`"),
    ("the cells an object", _with(("cells",), {}), "Expected `array`, got `object` - at `$.cells`"),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name, doc, reason", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_a_damaged_grid_is_one_line_naming_the_field(grid_dir, command, name, doc, reason):
    write(grid_dir, doc)
    code, _, err = run_cli(*COMMANDS[command](grid_dir))
    assert code == 2, err
    assert_clean(code, err)
    assert "grid.json is damaged or not written by this loadgen" in err and reason in err, err


def test_the_reader_says_the_same_without_the_cli(grid_dir):
    write(grid_dir, DAMAGED[1][1])
    with pytest.raises(ResultsError, match=r"Expected `int`, got `str` - at `\$.repeat`"):
        load_grid(grid_dir)


def _mutate(doc: object, path: list[int], value: object, drop: bool) -> object:
    """Replace (or with `drop`, remove) the node reached by walking `path` (indices into each
    container's keys)."""
    if not isinstance(doc, (dict, list)) or not doc:
        return value
    keys = list(doc.keys()) if isinstance(doc, dict) else list(range(len(doc)))
    key = keys[path[0] % len(keys)]
    if len(path) == 1 or not isinstance(doc[key], (dict, list)) or not doc[key]:
        if drop:
            del doc[key]
        else:
            doc[key] = value
        return doc
    doc[key] = _mutate(doc[key], path[1:], value, drop)
    return doc


@FUZZ
@given(path=st.lists(st.integers(0, 50), min_size=1, max_size=6), value=json_values, drop=st.booleans(),
       command=st.sampled_from(sorted(COMMANDS)))
def test_a_grid_damaged_anywhere_is_one_line_for_every_reader(grid_dir, path, value, drop, command):
    doc = _mutate(json.loads(json.dumps(GOOD)), path, value, drop)
    if isinstance(doc, dict):  # keep it a loadgen grid of this version, or it is refused at the door
        doc.setdefault("schema", GOOD["schema"])
        doc.setdefault("schema_version", GOOD["schema_version"])
    write(grid_dir, doc)
    code, _, err = run_cli(*COMMANDS[command](grid_dir))
    assert code in (0, 1, 2), (code, err)  # 1: a --resume that found work left, and its server could not start
    assert_clean(code, err)


@FUZZ
@given(cut=st.integers(0, 10_000), patch=st.binary(max_size=6), command=st.sampled_from(sorted(COMMANDS)))
def test_a_grid_file_cut_or_overwritten_is_one_line(grid_dir, cut, patch, command):
    text = json.dumps(GOOD).encode()
    cut %= len(text)
    (grid_dir / "grid.json").write_bytes(text[:cut] + patch + (text[cut + len(patch):] if patch else b""))
    code, _, err = run_cli(*COMMANDS[command](grid_dir))
    assert code in (0, 1, 2), (code, err)
    assert_clean(code, err)
