from __future__ import annotations

import types

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


# ---------------------------------------------------------------- tiers
# `scripts/test --quick` runs the tests marked `quick`: those that start no process (no server
# subprocess, no `loadgen` subprocess) and no server of their own on a socket (a simulator or
# fixture server in a thread): what they need of a server, a fake transport gives in-process. The mark is given here, by a rule
# that reads each test's code, so a new test lands in the right tier without a list to keep: a test
# is quick unless its body, or a fixture or module-level helper it reaches, names one of
# PROCESS_NAMES, or it requests a fixture of SERVER_FIXTURES, or it is marked real, browser or slow.
PROCESS_NAMES = frozenset({
    "subprocess", "Popen", "LOADGEN", "SimProcess", "start_llama_server", "start_nginx", "start_lossy_nginx",
    "start_prometheus", "sweep", "grid", "real_servers", "two_server_sweep",
    # servers in a thread of the test's own process, on a loopback socket
    "SimThread", "AppThread", "RewritingProxy", "RawListener", "LoopThread", "FixtureServer", "RawHttpServer",
    "InstantServer", "start_simulator", "refused_port", "free_port",
})
SERVER_FIXTURES = frozenset({"simulator", "real_servers", "two_server_sweep"})
NOT_QUICK_MARKS = ("real", "browser", "slow")


def _code_names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a code object and the functions nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _reaches_a_process(func: object, module_globals: dict, seen: set[int], depth: int = 3) -> bool:
    code = getattr(getattr(func, "__wrapped__", func), "__code__", None)
    if code is None or id(code) in seen or depth < 0:
        return False
    seen.add(id(code))
    names = _code_names(code)
    if names & PROCESS_NAMES:
        return True
    # One module's helpers (and fixtures) may start the process for it: follow them a few calls deep.
    return any(_reaches_a_process(module_globals[n], module_globals, seen, depth - 1)
               for n in names if isinstance(module_globals.get(n), types.FunctionType)
               and module_globals[n].__module__ == module_globals.get("__name__"))


def _is_quick(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(m) for m in NOT_QUICK_MARKS):
        return False
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return False
    function = getattr(item, "function", None)
    if function is None:
        return False
    module_globals = function.__globals__
    seen: set[int] = set()
    if _reaches_a_process(function, module_globals, seen):
        return False
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info else ()):
            func = fixturedef.func
            if _reaches_a_process(func, getattr(func, "__globals__", {}), seen):
                return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_quick(item):
            item.add_marker(pytest.mark.quick)
