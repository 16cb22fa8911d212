from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

# connections.py reads sys.platform at import (the kernel's receive stamps are Linux's): imported here,
# before any test switches the platform to another's, or a worker would keep the loop's clock for good.
import loadgen.client.connections  # noqa: F401
from loadgen.results.reader import load_records, load_run_dict
from servers import SimProcess, in_process_cli, start_llama_server, sweep


@pytest.fixture(scope="session", autouse=True)
def _history_elsewhere(tmp_path_factory):
    """No test writes the user's own history store: every run (in-process or a subprocess, which inherits
    the environment) records into a store of the session's own."""
    import os

    before = os.environ.get("LOADGEN_HISTORY")
    os.environ["LOADGEN_HISTORY"] = str(tmp_path_factory.mktemp("history") / "history.sqlite")
    yield
    if before is None:
        os.environ.pop("LOADGEN_HISTORY", None)
    else:
        os.environ["LOADGEN_HISTORY"] = before


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
    return proc, load_run_dict(out), load_records(out)




@pytest.fixture
def loadgen(monkeypatch, capsys):
    """Run `loadgen ARGS` in-process through cli.main, the real error path; returns (code, stdout, stderr)."""
    return in_process_cli(monkeypatch, capsys)


@pytest.fixture
def simulator():
    """A simulated llama-server in its own process, on a free loopback port."""
    with SimProcess("--profile", "smoke", "--slots", "2", "--time-scale", "0.05") as sim:
        yield sim.url


# ---------------------------------------------------------------- tiers
# `scripts/test --quick` (`pytest -m quick`) runs the test files marked quick: those that start no
# process (no server subprocess, no `loadgen` subprocess), run no server of their own on a socket (a
# simulator or fixture server in a thread) and search no property space (hypothesis). What such a
# test needs of a server, tests/fake_transport.py gives in-process. The mark is given here by a rule
# that reads each file's code, so a new file lands in its tier without a list to keep: a file is
# quick unless its code names one of NOT_QUICK_NAMES. Under -m quick the other files are not even
# imported (their imports alone take a while on a busy machine).
NOT_QUICK_NAMES = frozenset({
    # processes: tests/servers.py's helpers that start one, and the ways to start one directly
    "subprocess", "Popen", "LOADGEN", "SimProcess", "start_llama_server", "start_nginx", "start_lossy_nginx",
    "start_prometheus", "sweep", "grid", "real_servers", "two_server_sweep", "simulator",
    # servers in a thread of the test's own process, on a loopback socket
    "SimThread", "AppThread", "RewritingProxy", "RawListener", "LoopThread", "FixtureServer", "RawHttpServer",
    "InstantServer", "start_simulator", "refused_port", "free_port", "serve_handler",
    # property searches: hundreds of examples a test
    "hypothesis", "given",
})
# Files whose every test is slow for another reason, with it.
SLOW_FILES = {
    "test_report.py": "each test draws the report's matplotlib charts (20 s a test on a busy machine)",
}


def _names_in(path: Path) -> set[str]:
    """Every identifier a Python file uses: names, attributes, imported modules and names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update(part for alias in node.names for part in alias.name.split("."))
            names.update((getattr(node, "module", None) or "").split("."))
    return names


@functools.cache
def is_quick_file(path: Path) -> bool:
    """Whether a test file belongs to the quick tier (see above)."""
    return path.name not in SLOW_FILES and not (_names_in(path) & NOT_QUICK_NAMES)


def _quick_only(config: pytest.Config) -> bool:
    return (config.getoption("markexpr", "") or "").strip() == "quick"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if _quick_only(config) and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return not is_quick_file(collection_path) or None
    return None


# ---------------------------------------------------------------- workers
# scripts/test runs the suite on pytest-xdist workers (`--dist loadgroup`: tests go to whichever
# worker is free). A file with a module-scoped fixture (a run of minutes, several servers) keeps all
# its tests on one worker, so the fixture is made once: its tests carry an xdist_group named for the
# file, again by a rule that reads the file rather than a list. Session fixtures (real_servers) are
# made once per worker.
@functools.cache
def has_module_fixture(path: Path) -> bool:
    """Whether a test file defines a fixture with scope="module"."""
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Call) and any(k.arg == "scope" and isinstance(k.value, ast.Constant)
                                              and k.value.value == "module" for k in node.keywords):
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.path))
        if is_quick_file(path) and not any(item.get_closest_marker(m) for m in ("real", "slow")):
            item.add_marker(pytest.mark.quick)
        if has_module_fixture(path):
            item.add_marker(pytest.mark.xdist_group(path.stem))
