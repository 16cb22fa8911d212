"""`loadgen gate` end to end: real sweeps of real llama-servers from the test bed (scripts/testbed).

The baseline server runs the test bed's `-t 1`. The deliberately slower candidate is a classic
misconfiguration: four decode threads per CPU core. ggml's threads meet at a barrier after every
operation, and with more threads than cores each barrier waits for descheduled threads, so decoding
is 2-3x slower on any machine. (One slot instead of two at concurrency 2 is not enough here: with
one thread a 135M model gains nothing from batching, so queueing costs nothing either.)
The "same configuration" run sweeps the baseline server a second time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest

from loadgen import cli
from loadgen.commands.gate import compare_command, gate_command
from testbed import start_llama_server

pytestmark = pytest.mark.real

LOADGEN = [sys.executable, "-m", "loadgen.cli"]
LABEL = "smollm2"


def sweep(url: str, out) -> None:
    proc = subprocess.run([*LOADGEN, "sweep", "--url", url, "--label", LABEL, "--concurrency", "1,2",
                           "--n-predict", "16", "--requests", "12", "--output", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    logs = tmp_path_factory.mktemp("gate-llama-logs")
    out = tmp_path_factory.mktemp("gate-sweeps")
    servers = []
    try:
        servers.append(baseline := start_llama_server("gate-baseline", 2, logs))
        oversubscribed = str(4 * (os.cpu_count() or 1))
        servers.append(candidate := start_llama_server("gate-candidate", 2, logs, extra=("-t", oversubscribed)))
        # interleaved, so a slow spell of the machine does not fall on one side only
        sweep(baseline.url, out / "baseline")
        sweep(candidate.url, out / "candidate")
        sweep(baseline.url, out / "baseline-again")
    finally:
        for server in servers:
            server.stop()
    return out


@pytest.fixture
def loadgen(monkeypatch, capsys):
    """`loadgen ...` through cli.main, with compare and gate registered (as the lead will in cli.py)."""
    group = click.Group("loadgen", commands={**cli.cli.commands, "compare": compare_command, "gate": gate_command})
    monkeypatch.setattr(cli, "cli", group)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["loadgen", *map(str, args)])
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        return (code, *capsys.readouterr())

    return run


def test_an_oversubscribed_candidate_fails_the_gate(sweeps, loadgen):
    code, out, err = loadgen("gate", sweeps / "baseline", sweeps / "candidate")
    print(out, err)
    assert code == 1, out + err
    failing = [line.split() for line in out.splitlines() if line.startswith("REGRESSION: ")]
    assert failing and all(words[1] in ("throughput", "latency_p50", "latency_p99") and words[2] == LABEL
                           for words in failing)


def test_sweeping_the_same_configuration_twice_passes_the_gate(sweeps, loadgen):
    # The machine may be shared (other tests, builds): limits wide enough for its drift between two
    # sweeps a minute apart, still far inside the 2x latency the oversubscribed candidate shows.
    code, out, err = loadgen("gate", sweeps / "baseline", sweeps / "baseline-again",
                             "--max-throughput-drop", "20%", "--max-latency-rise", "25%")
    print(out, err)
    assert code == 0, out + err
    assert out.splitlines()[-1].startswith("gate: passed")


def test_compare_reports_the_slower_decode_as_significant(sweeps, loadgen):
    code, out, err = loadgen("compare", sweeps / "baseline", sweeps / "candidate", "--format", "json")
    assert code == 0, err
    levels = json.loads(out)["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    decode = next(m for m in levels[0]["metrics"] if m["metric"] == "decode_tok_s")
    assert decode["significant"] is True and decode["change"] < -0.2
