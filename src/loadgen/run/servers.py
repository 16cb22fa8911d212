"""A server loadgen starts itself (a grid cell's llama-server): launched, waited for, stopped for sure.

The server runs in a process group of its own (so a Ctrl-C at the terminal reaches loadgen, which
decides, and so stopping it reaches any process it started) and gets SIGTERM from the kernel if
loadgen dies without cleaning up (`core.processes.die_with_parent`). Its stdout and stderr go to
a log file, never a pipe: a verbose server can never block on a pipe nobody reads. `stop` sends
SIGTERM to the group, SIGKILL after a grace period, reaps it and checks by pid that it is gone.
`port_holder` says whose listening sockets answer on the server's port (`core.ports`): a server
that could not bind its port, or shares it, must not be measured through it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.ports import PortHolder, bind_problem, has_proc_net_tcp, ownership_check
from ..core.ports import port_holder as listening_holder
from ..core.processes import die_with_parent, parent_death_signal_available, pid_alive, watchdog_argv

STOP_GRACE_S = 15


class ServerStartError(Exception):
    """The server's command could not be run at all (no such program, not executable)."""


@dataclass
class ServerProcess:
    argv: list[str]
    url: str
    log_path: Path
    proc: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.proc.pid


def free_port(host: str = "127.0.0.1", within: tuple[int, int] | None = None) -> int:
    """A port nothing listens on now: any the kernel gives, or one of `within` (first, last), tried
    from a random one on so that a retry after a race gets another. ServerStartError when every
    port of `within` is taken."""
    if within is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    first, last = within
    ports = list(range(first, last + 1))
    start = random.randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise ServerStartError(f"no free port in --port-range {first}-{last} on {host}")


def port_holder(server: ServerProcess, host: str, port: int) -> PortHolder | None:
    """Who listens on host:port: the server's own processes alone ("ours"), another process too
    ("foreign"), nobody ("none"), or None where the system cannot tell. Once the server has exited
    a bind attempt still tells whether another process holds the port."""
    holder = listening_holder(host, port, session=server.pid)  # launched with a session of its own
    if holder is None and server.proc.poll() is not None:
        holder = "foreign" if bind_problem(host, port) == "in use" else "none"
    return holder


def fallback_notes(proc: Path = Path("/proc")) -> list[str]:
    """What this system lacks of Linux's for a server loadgen starts, and what is used instead; one
    line each, none on Linux."""
    notes = []
    if not parent_death_signal_available():
        notes.append("no parent-death signal on this system: each server runs under loadgen's watchdog, "
                     "which ends it when loadgen exits")
    if not has_proc_net_tcp(proc):
        notes.append(f"who holds a server's port is told by {ownership_check(proc)}")
    return notes


def launch(argv: Sequence[str], url: str, log_path: Path) -> ServerProcess:
    """Start `argv` with its output in `log_path`. Without the kernel's parent-death signal (not
    Linux) it runs under `core.watchdog`, whose stdin pipe closes when loadgen exits."""
    if not parent_death_signal_available():
        if not shutil.which(argv[0]) and not os.access(argv[0], os.X_OK):
            raise ServerStartError(f"could not run {argv[0]}: No such file or directory")
        with open(log_path, "wb") as log:
            log.write(b"loadgen: no parent-death signal on this system; the server runs under loadgen's watchdog\n")
            log.flush()
            proc = subprocess.Popen(watchdog_argv(list(argv)), stdin=subprocess.PIPE, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        return ServerProcess(list(argv), url, log_path, proc)
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=die_with_parent(signal.SIGTERM))
        except OSError as exc:
            raise ServerStartError(f"could not run {argv[0]}: {exc.strerror or exc}") from None
    return ServerProcess(list(argv), url, log_path, proc)


def health(url: str) -> tuple[int | None, str]:
    """GET /health: (HTTP status or None when nothing answers, the error message if any)."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read() or b"{}").get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            message = ""
        return exc.code, str(message)
    except (urllib.error.URLError, OSError):
        return None, ""


def wait_ready(server: ServerProcess, timeout_s: float, *, stop_requested: Callable[[], bool],
               on_wait: Callable[[float, str], None] | None = None, poll_s: float = 0.2) -> str | None:
    """Wait until /health answers 200. None when it does, else why not: the server exited, did not
    get healthy within `timeout_s`, or a stop was requested. `on_wait(elapsed_s, state)` is told
    what the server is doing ("starting", "Loading model") while it waits."""
    start = time.monotonic()
    while True:
        code = server.proc.poll()
        if code is not None:
            return f"the server exited with code {code} before it was healthy"
        status, message = health(server.url)
        if status == 200:
            return None
        if stop_requested():
            return "interrupted while the server was starting"
        elapsed = time.monotonic() - start
        if elapsed > timeout_s:
            return f"the server was not healthy within --wait-ready {timeout_s:g} s"
        if on_wait is not None:
            on_wait(elapsed, message or ("starting" if status is None else f"HTTP {status}"))
        time.sleep(poll_s)


def get_json(url: str, path: str) -> Any:
    """A GET's JSON body, or None when it fails."""
    try:
        with urllib.request.urlopen(url + path, timeout=10) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def stop(server: ServerProcess, grace_s: float = STOP_GRACE_S) -> int | None:
    """Stop the server and everything in its process group; return its exit code. Raises
    RuntimeError if its pid still exists afterwards (never expected: it has been reaped)."""
    proc = server.proc
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    _signal_group(proc.pid, signal.SIGKILL)  # anything the server itself started and left behind
    if pid_alive(proc.pid):
        raise RuntimeError(f"the server (pid {proc.pid}) is still running after it was stopped")
    return proc.returncode


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass
