"""Bad input ends as one line on stderr with exit code 2 (or 1 when the run itself failed), no traceback."""

from __future__ import annotations

import json
import sys

import pytest

from loadgen import cli
from testbed import free_port


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
    return {"latin": str(latin), "missing": str(tmp_path / "nope.txt"), "taken": str(taken)}


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
    (["sweep", "--url", "http://127.0.0.1:8080/v1"], "without a path"),
    (["sweep", "--url", "http://127.0.0.1:8080/?x=1"], "without a path or query"),
    (["sweep", "--url", "http://user:pw@127.0.0.1:8080"], "credentials"),
    (["analyze", "{missing}"], "not found"),
    (["analyze", "{taken}"], "not a loadgen run file"),
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
    port = free_port()  # nothing listens there
    out_dir = tmp_path / "run"
    code, out, err = run_cli(monkeypatch, capsys, "sweep", "--ports", str(port), "--concurrency", "1",
                             "--output", str(out_dir))
    assert code == 1
    assert f"127.0.0.1:{port}" in err and "cannot connect" in err
    assert "Traceback" not in err
    doc = json.loads((out_dir / "run.json").read_text())
    assert doc["complete"] is False
    assert "cannot connect" in doc["targets"][0]["error"]
