"""Bad input ends as one line on stderr with exit code 2 (or 1 when the run itself failed), no traceback."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen import cli
from servers import LOADGEN, refused_port


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["loadgen", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.fixture
def bad_files(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "run.json").write_text("{}")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory")
    return {"latin": str(latin), "missing": str(tmp_path / "nope.txt"), "taken": str(taken), "dir": str(tmp_path),
            "empty": str(empty), "file": str(plain), "good": str(Path(__file__).parent / "data" / "sweep-smollm2")}


BAD = [
    (["sweep", "--ports", "8080", "--concurrency", "1,x"], "not an integer"),
    (["sweep", "--ports", "8080", "--concurrency", "0"], "out of range"),
    (["sweep", "--ports", "8080", "--concurrency", "-2"], "out of range"),
    (["sweep", "--ports", "8080", "--concurrency", ""], "comma-separated"),
    (["sweep", "--ports", "8080", "--concurrency", "1,,2"], "comma-separated"),
    (["sweep", "--ports", "8080", "--concurrency", "2,2"], "listed twice"),
    (["sweep", "--ports", "70000"], "out of range"),
    (["sweep", "--ports", "8080,8080"], "listed twice"),
    (["sweep"], "no target"),
    (["sweep", "--url", "ftp://127.0.0.1:21"], "expected http"),
    (["sweep", "--url", "http://127.0.0.1:99999"], "port"),
    (["sweep", "--ports", "8080", "--bogus"], "No such option"),
    (["sweep", "--ports", "8080", "--requests", "0"], "--requests"),
    (["sweep", "--ports", "8080", "--duration", "-1"], "--duration"),
    (["sweep", "--ports", "8080", "--n-predict", "0"], "--n-predict"),
    (["sweep", "--ports", "8080", "--temperature", "-1"], "--temperature"),
    (["sweep", "--ports", "8080", "--api", "grpc"], "--api"),
    (["sweep", "--ports", "8080", "--prompt", "  "], "prompt is empty"),
    (["sweep", "--ports", "8080", "--prompt-file", "{missing}"], "No such file"),
    (["sweep", "--ports", "8080", "--prompt-file", "{latin}"], "not UTF-8"),
    (["sweep", "--ports", "8080", "--prompt", "x", "--prompt-file", "{latin}"], "not both"),
    (["sweep", "--ports", "8080,8081", "--label", "a", "--label", "a"], "distinct"),
    (["sweep", "--ports", "8080", "--label", "a", "--label", "b"], "--label"),
    (["sweep", "--ports", "8080", "--output", "{taken}"], "--force"),
    (["sweep", "--ports", "8080", "--timeout", "0"], "--timeout"),
    (["sweep", "--host", "http://127.0.0.1", "--ports", "8080"], "host name or address only"),
    (["sweep", "--host", "localhost:8080", "--ports", "8080"], "put the port in --ports"),
    (["sweep", "--url", "http://[::1"], "not a valid URL"),
    (["sweep", "--url", "http://127.0.0.1:8080/v1/chat/completions"], "an endpoint, not a base URL"),
    (["sweep", "--url", "http://127.0.0.1:8080/llama#x"], "fragment"),
    (["sweep", "--url", "http://127.0.0.1:8080", "--server-url", "http://127.0.0.1:1,http://127.0.0.1:2"],
     "2 --server-url values for 1 targets"),
    (["sweep", "--url", "http://user:pw@127.0.0.1:8080"], "credentials"),
    (["analyze", "{missing}"], "not found"),
    (["analyze", "{taken}"], "not a loadgen run file"),
    # reliability suite (#10)
    (["sweep", "--ports", "8080", "--concurrency", "5000"], "out of range"),
    (["sweep", "--ports", ""], "comma-separated"),
    (["sweep", "--ports", " , "], "comma-separated"),
    (["sweep", "--url", ""], "expected http"),
    (["sweep", "--host", "", "--ports", "8080"], "host name or address only"),
    (["sweep", "--ports", "8080", "--prompt-file", "{dir}"], "is a directory"),
    (["sweep", "--ports", "8080", "--prompt-file", "{empty}"], "empty"),
    (["sweep", "--ports", "8080", "--output", "{file}/run"], "cannot write to"),
    (["sweep", "--ports", "8080", "--output", "{file}"], "is a file"),
    (["sweep", "--ports", "8080", "--rate", "1", "--concurrency", "2"], "not both"),
    (["sweep", "--ports", "8080", "--api", "openai"], "--api 'openai'"),
    (["sweep", "--ports", "8080", "--api", ""], "--api ''"),
    (["sweep", "--ports", "8080", "--probe-interval", "-1"], "--probe-interval"),
    (["sweep", "--ports", "8080", "--wait-ready", "-1"], "--wait-ready"),
    (["sweep", "--ports", "8080", "--seed", "abc"], "--seed"),
    (["sweep", "--ports", "8080", "--knee-gain", "-0.1"], "--knee-gain"),
    (["sweep", "--ports", "8080", "--warmup", "-1"], "--warmup"),
    (["sweep", "--ports", "8080", "--api-key", " "], "API key is empty"),
    (["sim", "--fault", "nope:1"], "unknown fault 'nope'"),
    (["sim", "--fault", "http_500:2"], "SHARE must be in (0, 1]"),
    (["sim", "--port", "70000"], "--port"),
    (["sim", "--slots", "0"], "--slots"),
    (["sim", "--profile", "{missing}"], "--profile"),
    (["report", "{good}", "--output", "{file}/report.html"], "cannot write"),
    (["export", "{good}", "--format", "csv", "--output", "{file}/x"], "cannot write"),
    (["export", "{taken}", "--format", "csv"], "not a loadgen run file"),
]


@pytest.mark.parametrize("args,expected", BAD, ids=[" ".join(a[1:]) or "empty" for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, bad_files, args, expected):
    args = [a.format(**bad_files) for a in args]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("loadgen: error: ")
    assert expected in lines[0]
    assert "Traceback" not in err


def test_unreachable_port_is_named_and_exits_1_with_a_valid_run_file(monkeypatch, capsys, tmp_path):
    out_dir = tmp_path / "run"
    with refused_port() as port:  # nothing listens there
        code, out, err = run_cli(monkeypatch, capsys, "sweep", "--ports", str(port), "--concurrency", "1",
                                 "--output", str(out_dir))
    assert code == 1
    assert f"127.0.0.1:{port}" in err and "connection refused" in err
    assert "Traceback" not in err
    doc = json.loads((out_dir / "run.json").read_text())
    assert doc["complete"] is False
    assert "connection refused" in doc["targets"][0]["error"]


# --- damaged results directories, for every command that reads one ------------------------------------

GOOD_RUN = Path(__file__).parent / "data" / "sweep-smollm2"


def _edit_run(edit):
    def apply(d: Path) -> None:
        doc = json.loads((d / "run.json").read_text())
        edit(doc)
        (d / "run.json").write_text(json.dumps(doc))
    return apply


def _cut(name: str):
    def apply(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[: len(data) // 2])
    return apply


DAMAGED = {
    "truncated run.json": (_cut("run.json"), "run.json is not valid JSON"),
    "empty run.json": (lambda d: (d / "run.json").write_text(""), "run.json is not valid JSON"),
    "binary run.json": (lambda d: (d / "run.json").write_bytes(b"\xff\xfe\x00\x01"), "run.json is not valid JSON"),
    "run.json a list": (lambda d: (d / "run.json").write_text("[]"), "not a loadgen run file"),
    "wrong schema": (_edit_run(lambda doc: doc.update(schema="pyperf")), "not a loadgen run file"),
    "future version": (_edit_run(lambda doc: doc.update(schema_version=99)), "schema version 99"),
    "wrong field type": (_edit_run(lambda doc: doc["targets"][0]["levels"][0].update(concurrency="4")),
                         "$.targets[0].levels[0].concurrency"),
    "target not an object": (_edit_run(lambda doc: doc["targets"].append("x")), "$.targets[1]"),
    "missing requests.jsonl": (lambda d: (d / "requests.jsonl").unlink(), "requests.jsonl not found"),
    "truncated requests.jsonl": (_cut("requests.jsonl"), "requests.jsonl:"),
    "wrong record type": (lambda d: (d / "requests.jsonl").write_text('{"target": 1}\n'),
                          "requests.jsonl:1: not a request record"),
}
READERS = {
    "analyze": lambda bad, good: ["analyze", bad],
    "report": lambda bad, good: ["report", bad, "--format", "markdown"],
    "export": lambda bad, good: ["export", bad, "--format", "csv", "--output", bad / "exported"],
    "compare": lambda bad, good: ["compare", good, bad],
    "gate": lambda bad, good: ["gate", bad, good],
}


@pytest.mark.parametrize("command", list(READERS))
@pytest.mark.parametrize("damage", list(DAMAGED))
def test_a_damaged_results_dir_is_one_line_and_exit_2(loadgen, tmp_path, damage, command):
    bad = tmp_path / "bad"
    shutil.copytree(GOOD_RUN, bad)
    apply, message = DAMAGED[damage]
    apply(bad)
    code, out, err = loadgen(*READERS[command](bad, GOOD_RUN))
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loadgen: error: "), err
    assert message in lines[0] and "Traceback" not in err


# --- more connections than the process may open files ---------------------------------------------

def _sweep_with_fd_limit(soft: int, hard: int, *args: str) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return subprocess.run([*LOADGEN, "sweep", *args], capture_output=True, text=True, timeout=120, preexec_fn=limit)


def test_concurrency_beyond_the_hard_fd_limit_is_refused_with_advice(tmp_path):
    proc = _sweep_with_fd_limit(256, 256, "--ports", "9", "--concurrency", "1,1024", "--output", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "loadgen: error: 1024 connections need about 1088 open files, but this process may open 256 "
        "(hard limit 256); raise the limit (ulimit -n 1088) or lower the concurrency"]
    assert not (tmp_path / "r").exists()


def test_parallel_targets_count_every_targets_connections(tmp_path):
    proc = _sweep_with_fd_limit(512, 512, "--ports", "9,10", "--concurrency", "256", "--parallel-targets",
                                "--output", str(tmp_path / "r"))
    assert proc.returncode == 2 and "512 connections need about 576 open files" in proc.stderr


def test_a_low_soft_fd_limit_is_raised_up_to_the_hard_one(monkeypatch):
    from loadgen.cli.sweep import ensure_open_files

    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (256, 8192))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    ensure_open_files(1024)
    assert calls == [(1088, 8192)]
    ensure_open_files(100)  # fits under the soft limit: left alone
    assert calls == [(1088, 8192)]
