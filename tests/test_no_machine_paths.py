"""No tracked file names a path of the machine it was written on (issue: output that reads well).

A results fixture recorded on a developer's machine carries its model path, a profile may cite a
source by where it lay: both leak one machine's layout into the project. Sources are cited by name;
fixtures carry relative or neutral paths (`models/x.gguf`, `/models/x.gguf`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# A home, root's home, a scratch or work tree: the places one machine's files live.
R = "/"  # the examples below are built from pieces, so this file holds no such path itself
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:root|home/[a-z_][\w-]*|Users/\w+|work|tmp)/[\w.-]")


def tracked_text_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in out.decode().split("\0") if name]


@pytest.mark.parametrize("text, found", [
    ("model_path: " + R + "root/.cache/loadgen/SmolLM2.gguf", True),
    ('"model_path": "' + R + 'home/alice/models/a.gguf"', True),
    ("see " + R + "work/shared/field-reports.md", True),
    ("written to " + R + "tmp/run-1/run.json", True),
    (R + "Users/bob/llama.cpp", True),
    ('"model_path": "models/SmolLM2-135M-Instruct.Q4_1.gguf"', False),
    ('"model_path": "/models/smoke-sim.gguf"', False),
    ("cached under ~/.cache/loadgen/", False),
    ("http://127.0.0.1:8080/v1/completions", False),
    ("the field report (published on the llama.cpp discussions)", False),
])
def test_the_pattern_knows_a_machine_path(text, found):
    assert bool(MACHINE_PATH.search(text)) is found


def test_no_tracked_file_names_a_path_of_this_machine():
    hits = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        hits += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
                 for m in MACHINE_PATH.finditer(text)]
    assert not hits, "paths of one machine in tracked files:\n" + "\n".join(hits[:20])
