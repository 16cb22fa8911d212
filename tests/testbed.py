"""Start and stop real llama-server processes for the tests (by pid, loopback only)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOADGEN = [sys.executable, "-m", "loadgen.cli"]


def sweep(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`loadgen sweep ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([*LOADGEN, "sweep", *args], capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs: bound, never
    listening. A port that was merely free a moment ago may be listened on by then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def start_sim(*args: str) -> tuple[subprocess.Popen, str]:
    """`loadgen sim --port 0 ARGS` in its own process, and its URL once it listens. The simulator
    binds the port itself: a port picked here and passed on could be taken by another process
    (another test run, another engineer's server) in between, and the tests would talk to that."""
    proc = subprocess.Popen([*LOADGEN, "sim", "--port", "0", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()  # "loadgen sim: ... on http://127.0.0.1:PORT, ..." once it listens
    if " on http" not in line:
        proc.kill()
        raise RuntimeError(f"the simulator did not start: {line}{proc.communicate()[1]}")
    return proc, line.split(" on ")[1].split(",")[0]


def testbed_paths() -> tuple[str, str]:
    """(llama-server binary, model), building/fetching them with scripts/testbed when missing."""
    server, model = os.environ.get("LOADGEN_LLAMA_SERVER"), os.environ.get("LOADGEN_MODEL")
    if server and model:
        return server, model
    out = subprocess.run([str(ROOT / "scripts" / "testbed")], check=True, capture_output=True, text=True).stdout
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return found["LOADGEN_LLAMA_SERVER"], found["LOADGEN_MODEL"]


@dataclass
class LlamaServer:
    proc: subprocess.Popen
    port: int
    alias: str
    slots: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_llama_server(alias: str, slots: int, log_dir: Path, *, metrics: bool = True,
                       extra: tuple[str, ...] = (), ready_timeout: float = 120, port: int | None = None) -> LlamaServer:
    """A llama-server on `port` (a free one when None: give the old port to restart a server)."""
    binary, model = testbed_paths()
    port = port or free_port()
    log = log_dir / f"{alias}-{port}-{time.monotonic_ns()}.log"
    args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--parallel", str(slots),
            "-c", "4096", "-t", "1", "--alias", alias, *(["--metrics"] if metrics else []), *extra]
    with log.open("wb") as f:
        proc = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    server = LlamaServer(proc, port, alias, slots, log)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"llama-server on {port} not ready after {ready_timeout} s")
