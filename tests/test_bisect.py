"""`loadgen bisect` on stand-in repositories: each commit's "build" copies its simulator profile, its
server is `loadgen sim` with that profile, and the commits from one on decode at half the speed.

The issue's case: 16 commits, commit 11 slower, commit 6 does not build: commit 11 is named in at
most ceil(log2 16) + 2 = 6 builds. A repository without a regression ends at its ends; one whose
only commit between the last good and the first bad one does not build ends with the range.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from servers import LOADGEN

PROFILE = """name = "bisect-{i}"
model_alias = "bisect-sim"
model_path = "/models/bisect.gguf"
prefill_tok_s = 50000.0
step_ms = {step_ms}
alpha = 0.25
n_ctx = 2048
eos_probability = 0.0
"""
BUILD = "test ! -e {src}/BROKEN && cp {src}/profile.toml {src}/built.toml"
SERVER = f"{sys.executable} -m loadgen sim --profile {{src}}/built.toml --port {{port}} --slots 2"
SWEEP = ("--concurrency", "2", "--requests", "8", "--n-predict", "16", "--warmup", "1",
         "--max-throughput-drop", "20%", "--max-latency-rise", "20%")


def make_repo(path: Path, commits: int, first_slow: int | None, broken: tuple[int, ...] = ()) -> list[str]:
    """A git repository of `commits` commits ("commit 0" ...), their shas oldest first."""
    path.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    git("config", "user.email", "bisect@example.invalid")
    git("config", "user.name", "bisect test")
    for i in range(commits):
        slow = first_slow is not None and i >= first_slow
        (path / "profile.toml").write_text(PROFILE.format(i=i, step_ms=4.0 if slow else 2.0))
        (path / "BROKEN").unlink(missing_ok=True)
        if i in broken:
            (path / "BROKEN").write_text("")
        git("add", "-A")
        git("commit", "-q", "-m", f"commit {i}")
    return git("log", "--reverse", "--format=%H").split()


def bisect(repo: Path, out: Path, good: str, bad: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*LOADGEN, "bisect", "--repo", str(repo), "--good", good, "--bad", bad, "--build", BUILD,
                           "--server", SERVER, "--repeat", "2", "--max-repeat", "3", "--output", str(out), *SWEEP,
                           *extra], capture_output=True, text=True, timeout=600)


def test_names_the_first_slow_commit_in_log2_plus_two_builds(tmp_path):
    shas = make_repo(tmp_path / "repo", 16, first_slow=11, broken=(6,))
    proc = bisect(tmp_path / "repo", tmp_path / "out", shas[0], shas[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert doc["status"] == "found" and doc["first_bad"] == shas[11], proc.stderr[-3000:]
    assert doc["builds"] <= math.ceil(math.log2(16)) + 2
    assert f"first bad commit: {shas[11][:10]} commit 11" in proc.stdout
    verdicts = {c["subject"]: c.get("verdict") for c in doc["commits"]}
    assert verdicts["commit 10"] == "good" and verdicts["commit 15"] == "bad"
    # the worktrees are gone, and git knows none of them
    assert not any((tmp_path / "out" / "src").glob("*/")), list((tmp_path / "out" / "src").iterdir())
    listed = subprocess.run(["git", "-C", str(tmp_path / "repo"), "worktree", "list"], capture_output=True,
                            text=True).stdout
    assert len(listed.splitlines()) == 1, listed


def test_a_skipped_commit_leaves_a_range(tmp_path):
    """good 0, 1 does not build, 2 and 3 slow: the first bad commit is 1 or 2 (exit 3)."""
    shas = make_repo(tmp_path / "repo", 4, first_slow=2, broken=(1,))
    proc = bisect(tmp_path / "repo", tmp_path / "out", shas[0], shas[-1])
    assert proc.returncode == 3, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert doc["status"] == "range" and doc["candidates"] == [shas[1], shas[2]]
    skipped = doc["commits"][1]
    assert skipped["verdict"] == "skip" and "does not build" in skipped["reason"]
    # continued, a finished search answers again from what it kept: nothing built or measured anew
    again = subprocess.run([*LOADGEN, "bisect", "--resume", str(tmp_path / "out")], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 3, again.stderr[-3000:]
    assert "building" not in again.stderr and " run 1:" not in again.stderr, again.stderr
    assert json.loads((tmp_path / "out" / "bisect.json").read_text()) == doc


def test_no_regression_between_the_ends(tmp_path):
    shas = make_repo(tmp_path / "repo", 5, first_slow=None)
    proc = bisect(tmp_path / "repo", tmp_path / "out", shas[0], shas[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "bisect.json").read_text())
    assert doc["status"] == "no_regression" and doc["builds"] == 2
    assert "no regression between good" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--good", "HEAD", "--bad", "HEAD~1"), "is not an ancestor of --bad"),
    (("--good", "HEAD~1", "--bad", "nosuchrev"), "git rev-parse"),
    (("--good", "HEAD~1", "--bad", "HEAD", "--server", "loadgen sim --port {port}"), "{src}"),
    (("--good", "HEAD~1", "--bad", "HEAD", "--server", "x {src} {model} {port}"), "{model} is not filled"),
    (("--good", "HEAD~1", "--bad", "HEAD", "--max-throughput-drop", "lots"), "max-throughput-drop"),
])
def test_bad_input_is_one_line_before_any_build(tmp_path, args, message):
    make_repo(tmp_path / "repo", 2, first_slow=None)
    server = () if "--server" in args else ("--server", SERVER)
    proc = subprocess.run([*LOADGEN, "bisect", "--repo", str(tmp_path / "repo"), "--build", BUILD, *server, *args,
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "src").exists()


def test_a_folder_that_is_no_repository_is_one_line(tmp_path):
    (tmp_path / "plain").mkdir()
    proc = subprocess.run([*LOADGEN, "bisect", "--repo", str(tmp_path / "plain"), "--good", "a", "--bad", "b",
                           "--build", BUILD, "--server", SERVER, "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a git repository; give the server's clone" in proc.stderr, proc.stderr
