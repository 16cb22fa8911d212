from __future__ import annotations

import sys
import time
import urllib.request

import pytest

from loadgen.results import load_records, load_run
from testbed import start_llama_server, start_sim, sweep


@pytest.fixture(scope="session")
def real_servers(tmp_path_factory):
    """Two real llama-servers: 4 slots and 1 slot, both with --metrics -c 4096 -t 1."""
    logs = tmp_path_factory.mktemp("llama-logs")
    four = start_llama_server("smollm2-4slot", 4, logs)
    try:
        one = start_llama_server("smollm2-1slot", 1, logs)
    except BaseException:
        four.stop()
        raise
    yield four, one
    four.stop()
    one.stop()


@pytest.fixture(scope="session")
def two_server_sweep(real_servers, tmp_path_factory):
    four, one = real_servers
    out = tmp_path_factory.mktemp("sweep") / "run"
    proc = sweep("--ports", f"{four.port},{one.port}", "--concurrency", "1,2,4", "--n-predict", "16",
                 "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    return proc, load_run(out), load_records(out)




@pytest.fixture
def loadgen(monkeypatch, capsys):
    """Run `loadgen ARGS` in-process through cli.main, the real error path; returns (code, stdout, stderr)."""
    from loadgen import cli

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["loadgen", *map(str, args)])
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def simulator():
    """A simulated llama-server in its own process, on a free loopback port."""
    proc, url = start_sim("--profile", "smoke", "--slots", "2", "--time-scale", "0.05")
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the simulator did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)
