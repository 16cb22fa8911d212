from __future__ import annotations

import pytest

from loadgen.results.reader import load_records, load_run
from servers import SimProcess, in_process_cli, start_llama_server, sweep


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
    return in_process_cli(monkeypatch, capsys)


@pytest.fixture
def simulator():
    """A simulated llama-server in its own process, on a free loopback port."""
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "0.05") as sim:
        yield sim.url
