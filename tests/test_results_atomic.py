"""results/atomic.py: a results file is replaced whole or left as it was, and reads as its neighbours do."""

from __future__ import annotations

import json
import math
import os

import pytest

from loadgen.results.atomic import atomic_write, new_file_mode, write_json


def test_a_write_that_fails_leaves_the_old_file_and_no_temp_file(tmp_path):
    path = tmp_path / "capacity.json"
    write_json(path, {"capacity": {"verdict": "serves 3"}})
    with pytest.raises(ValueError):  # JSON has no infinity: refused before the file is touched
        write_json(path, {"capacity": {"score": math.inf}})

    def chunks():
        yield '{"half": '
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(path, chunks())
    assert json.loads(path.read_text()) == {"capacity": {"verdict": "serves 3"}}
    assert [p.name for p in tmp_path.iterdir()] == ["capacity.json"]


def test_a_new_file_has_the_mode_of_any_file_this_process_makes(tmp_path):
    write_json(tmp_path / "ab.json", [1, 2], indent=None)
    (tmp_path / "plain").write_text("x")
    assert (tmp_path / "ab.json").read_text() == "[1, 2]\n"
    assert os.stat(tmp_path / "ab.json").st_mode & 0o777 == os.stat(tmp_path / "plain").st_mode & 0o777 == new_file_mode()
