"""A grid cell measures only its own server: its port is free before the server starts, and every
socket listening on it is the server's once /health answers (issue 32). The rules on tables whose
answers were written down first; then grids whose cell port a test-started server holds, before the
cell's server starts or while it starts, and a port grid picked itself that was taken meanwhile."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadgen.analysis.server_ownership import asked_slots, not_the_cells_server
from loadgen.core.ports import Listener, bind_problem, holder, parse_proc_net_tcp, port_holder, takes_connections_to
from loadgen.core.processes import pid_alive
from servers import GRID_SERVER, LOADGEN, ROOT, free_port, grid, grid_pids, terminate, wait_healthy

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
TAIL = "00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000000000000000 100 0 0 10 0"
V6_ANY = "0" * 32
MAPPED = str(ipaddress.ip_address("::ffff:127.0.0.1"))  # Python's own spelling differs by version

# (a row's local address, remote address, state, inode) -> the listener parsed, or None (not listening)
PROC_NET_ROWS = [
    ("0100007F:1F90", "00000000:0000", "0A", 12345, Listener("127.0.0.1", 8080, 12345)),
    ("00000000:0050", "00000000:0000", "0A", 222, Listener("0.0.0.0", 80, 222)),
    ("0100007F:1F90", "0100007F:D431", "01", 7, None),  # an established connection
    (f"{V6_ANY}:1F91", f"{V6_ANY}:0000", "0A", 333, Listener("::", 8081, 333)),
    ("00000000000000000000000001000000:1F92", f"{V6_ANY}:0000", "0A", 444, Listener("::1", 8082, 444)),
    ("0000000000000000FFFF00000100007F:1F93", f"{V6_ANY}:0000", "0A", 555, Listener(MAPPED, 8083, 555)),
]


@pytest.mark.parametrize("local, remote, state, inode, expected", PROC_NET_ROWS)
def test_proc_net_tcp_rows(local, remote, state, inode, expected):
    text = HEADER + f"   0: {local} {remote} {state} " + TAIL.format(inode=inode) + "\n"
    assert parse_proc_net_tcp(text) == ([expected] if expected else [])


# (listener address, the host's addresses; empty: any) -> does a connection to the host reach it?
REACHES = [
    ("127.0.0.1", {"127.0.0.1"}, True),
    ("0.0.0.0", {"127.0.0.1"}, True),
    ("::", {"127.0.0.1"}, True),
    ("::ffff:127.0.0.1", {"127.0.0.1"}, True),
    ("10.0.0.5", {"127.0.0.1"}, False),
    ("::1", {"127.0.0.1"}, False),
    ("10.0.0.5", set(), True),
]


@pytest.mark.parametrize("address, host_addresses, expected", REACHES)
def test_which_listeners_take_the_connections(address, host_addresses, expected):
    assert takes_connections_to(Listener(address, 80, 1), host_addresses) is expected


# (inodes of the port's listeners, our sockets' inodes) -> who holds the port
HOLDERS = [
    ([], {1}, "none"),
    ([1], {1, 2}, "ours"),
    ([1, 2], {1, 2}, "ours"),  # our server's two listeners (e.g. IPv4 and IPv6)
    ([1, 9], {1}, "foreign"),  # SO_REUSEPORT: ours and another process's on one port
    ([9], {1}, "foreign"),
    ([9], set(), "foreign"),  # our server is gone, another process listens
]


@pytest.mark.parametrize("inodes, ours, expected", HOLDERS)
def test_who_holds_a_port(inodes, ours, expected):
    assert holder([Listener("127.0.0.1", 80, i) for i in inodes], ours) == expected


ADDRESS = "127.0.0.1:8080"
IN_USE = "could not bind 127.0.0.1:8080 (in use)"
# (holder, the cell's server still running, slots /props reports, the cell's --parallel) -> reason
OWNERSHIP = [
    ("ours", True, 1, 1, None),
    ("ours", True, None, None, None),
    ("foreign", True, 2, 1, IN_USE),  # the port answered, but not (only) from our server
    ("foreign", True, 1, 1, IN_USE),  # the same slots prove nothing: the listener decides
    ("foreign", False, None, 1, IN_USE),  # it could not bind and exited; the other server answers
    ("none", False, None, 1, None),  # it exited, nothing listens: the exit is the reason
    ("none", True, 1, 1, "/health answered but nothing listens on 127.0.0.1:8080 now; not measured"),
    (None, True, 2, 1, "the server answering on 127.0.0.1:8080 reports 2 slots, the cell's --parallel is 1: "
                       "not the cell's server; not measured"),
    (None, True, 1, 1, None),
    (None, True, None, 1, None),  # no /props and no /proc: nothing says it is another server
    ("ours", True, 4, None, None),  # --parallel unset (auto): no count to compare
    ("ours", True, 4, 2, "the server answering on 127.0.0.1:8080 reports 4 slots, the cell's --parallel is 2: "
                         "not the cell's server; not measured"),
]


@pytest.mark.parametrize("holder_, running, reported, parallel, expected", OWNERSHIP)
def test_is_it_the_cells_server(holder_, running, reported, parallel, expected):
    assert not_the_cells_server(ADDRESS, holder_, running, reported, parallel) == expected


@pytest.mark.parametrize("text, expected", [(None, None), ("2", 2), ("-1", None), ("auto", None), ("0", None)])
def test_asked_slots(text, expected):
    assert asked_slots(text) == expected


def _fake_proc(root: Path, port: int, listeners: dict[int, str], processes: dict[int, tuple[int, list[int]]]) -> Path:
    """A /proc tree: net/tcp with `listeners` {inode: hex address} on `port`, and per pid its
    session and the socket inodes its fds hold."""
    (root / "net").mkdir(parents=True)
    rows = [f"   {i}: {address}:{port:04X} 00000000:0000 0A " + TAIL.format(inode=inode)
            for i, (inode, address) in enumerate(listeners.items())]
    (root / "net" / "tcp").write_text(HEADER + "\n".join(rows) + "\n")
    for pid, (session, inodes) in processes.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "stat").write_text(f"{pid} (llama server) (x)) S 1 {session} {session} 0 -1 4194560\n")
        for fd, inode in enumerate(inodes, 3):
            os.symlink(f"socket:[{inode}]", root / str(pid) / "fd" / str(fd))
        os.symlink("/dev/null", root / str(pid) / "fd" / "0")
    return root


def test_port_holder_reads_the_socket_table_and_the_sessions_fds(tmp_path, monkeypatch):
    """Session 10 (the server and a child of it) holds inode 100; pid 20, another session, holds 200."""
    monkeypatch.delenv("LOADGEN_LINUX_FACILITIES", raising=False)  # the /proc/net/tcp reader itself, on a fake /proc
    loopback, anywhere = "0100007F", "00000000"
    processes = {10: (10, [100]), 11: (10, [101]), 20: (20, [200])}
    shared = _fake_proc(tmp_path / "a", 8080, {100: loopback, 200: anywhere}, processes)
    assert port_holder("127.0.0.1", 8080, 10, shared) == "foreign"
    alone = _fake_proc(tmp_path / "b", 8080, {100: loopback}, processes)
    assert port_holder("127.0.0.1", 8080, 10, alone) == "ours"
    assert port_holder("127.0.0.1", 8080, 20, alone) == "foreign"
    assert port_holder("127.0.0.1", 8081, 10, alone) == "none"
    assert port_holder("127.0.0.1", 8080, 10, tmp_path / "no-proc") is None


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc")
def test_a_listening_socket_on_this_machine():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert bind_problem("127.0.0.1", port) == "in use" and bind_problem("0.0.0.0", port) == "in use"
        assert port_holder("127.0.0.1", port, os.getsid(0)) == "ours"
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        try:
            assert port_holder("127.0.0.1", port, other.pid) == "foreign"
        finally:
            other.kill()
            other.wait()
    assert bind_problem("127.0.0.1", port) is None


# --- grids whose cell port another (test-started) server holds ----------------------------------------

def _foreign_server(port: int, log: Path, *extra: str) -> subprocess.Popen:
    """A stand-in llama-server with 2 slots on `port`, started by the test (stopped by it, by pid)."""
    with log.open("wb") as f:
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fake-llama-server.py"), "--port", str(port),
                                 "--parallel", "2", *extra], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 60, proc, "the foreign server")
    except RuntimeError:
        terminate(proc)
        raise
    return proc


def _measured(log: Path) -> int:
    """How many completion requests a stand-in server served (it logs a line per request)."""
    return sum(line.startswith("completion request") for line in log.read_text().splitlines())


def _runs(folder: Path) -> list[dict]:
    return [c["runs"][0] for c in json.loads((folder / "grid.json").read_text())["cells"]]


SWEEP = ("--concurrency", "1", "--requests", "2", "--n-predict", "8", "--warmup", "0")


@pytest.mark.parametrize("reuse_port", [False, True], ids=["plain", "so_reuseport"])
def test_a_taken_port_fails_its_cell_before_the_server_starts(tmp_path, reuse_port):
    """The first cell's --port is held by a 2-slot server of the test's (with SO_REUSEPORT too, as
    llama-server listens, where a second server would bind it without an error): that cell fails
    with the bind reason, its server never starts, nothing is sent to the foreign server, and the
    grid goes on to the next cell."""
    port, log = free_port(), tmp_path / "foreign.log"
    extra = ("--reuse-port",) if reuse_port else ()
    foreign = _foreign_server(port, log, *extra)
    try:
        out = tmp_path / "grid"
        proc = grid("--server", f"{GRID_SERVER} {{where}} --parallel 1 {' '.join(extra)}", "--param",
                    f"where=--port={port},--seed=1", *SWEEP, "--output", str(out))
        assert proc.returncode == 1, proc.stderr
        taken, other = _runs(out)
        assert (taken["status"], taken["reason"]) == ("failed", f"could not bind 127.0.0.1:{port} (in use)")
        assert "pid" not in taken and "run_dir" not in taken and "props" not in taken
        assert other["status"] == "ok" and other["props"]["total_slots"] == 1
        assert _measured(log) == 0 and foreign.poll() is None
        assert not any(pid_alive(p) for p in grid_pids(out))
        assert f"could not bind 127.0.0.1:{port} (in use)" in proc.stderr
    finally:
        terminate(foreign)


@pytest.mark.parametrize("mode", ["exits", "shares", "never-binds"])
def test_a_server_that_does_not_hold_its_port_is_not_measured(tmp_path, mode):
    """The port is free when the cell's server starts; the server waits (for a file) before it binds,
    and meanwhile a 2-slot server of the test's takes the port and answers /health. Then the cell's
    server tries to bind and exits as llama-server does ("exits"), binds beside it with SO_REUSEPORT
    ("shares"), or never tries ("never-binds": it stays alive, answering nothing). Each time the cell
    fails with the bind reason and no request reaches the foreign server."""
    port, go, log, out = free_port(), tmp_path / "go", tmp_path / "foreign.log", tmp_path / "grid"
    reuse = ("--reuse-port",) if mode == "shares" else ()
    cmd = [*LOADGEN, "grid", "--server", f"{GRID_SERVER} --port {port} --bind-after {go} --parallel {{parallel}} "
           + " ".join(reuse), "--param", "parallel=1", "--wait-ready", "60", *SWEEP, "--output", str(out)]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    foreign = None
    try:
        server_log = out / "cells" / "c01" / "r1" / "server.log"
        deadline = time.monotonic() + 60
        while not server_log.exists() or "before binding" not in server_log.read_text():
            assert run.poll() is None and time.monotonic() < deadline, "the cell's server never started"
            time.sleep(0.05)
        foreign = _foreign_server(port, log, *reuse)
        if mode != "never-binds":
            go.touch()
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 1, stderr
        (entry,) = _runs(out)
        assert (entry["status"], entry["reason"]) == ("failed", f"could not bind 127.0.0.1:{port} (in use)")
        assert "run_dir" not in entry and "measure_exit" not in entry
        assert _measured(log) == 0 and foreign.poll() is None
        assert not any(pid_alive(p) for p in grid_pids(out))
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if foreign is not None:
            terminate(foreign)


def test_a_port_grid_picked_that_was_taken_is_replaced(tmp_path, monkeypatch):
    """grid picks a free port itself; when another process takes it before the server starts, the
    cell is run on another port instead of failing."""
    from rich.console import Console

    from loadgen.cli import grid as grid_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        ports = iter([taken_port, free_port()])
        monkeypatch.setattr(grid_cli, "free_port", lambda within=None: next(ports))
        doc = grid_cli.new_grid(f"{GRID_SERVER} --parallel {{parallel}}", ("parallel=1",), 1, "sweep", SWEEP, 60)
        root = tmp_path / "grid"
        root.mkdir()
        err = Console(file=open(tmp_path / "err.txt", "w"), width=200)  # noqa: SIM115 (closed below, before it is read)
        entry = grid_cli.CellRunner(root, doc, err).run(doc.cells[0], 1)
        err.file.close()
    assert entry.status == "ok", entry.reason
    assert entry.url != f"http://127.0.0.1:{taken_port}"
    assert "trying another port" in (tmp_path / "err.txt").read_text()
    assert not pid_alive(entry.pid)
