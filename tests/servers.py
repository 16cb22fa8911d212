"""Every server the tests start, and the CLI they drive, in one place. Everything listens on loopback.

- `free_port`, `wait_healthy`: a free port on 127.0.0.1; wait until a server's /health answers 200.
- `SimProcess`: `loadgen sim` in its own process (its URL only once it answers /health).
- `SimThread`, `RawListener`, `LoopThread`: a simulated llama-server or a misbehaving listener on
  an event loop in a background thread, for tests that drive `loadgen` in-process (its sweep owns
  the main thread's event loop and signal handlers).
- `start_llama_server`, `LlamaServer`, `testbed_paths`: the real llama-server test bed
  (scripts/testbed), started and stopped by pid.
- `LOADGEN`, `sweep`, `in_process_cli`: `loadgen` as a user runs it (a subprocess), or in-process
  through `cli.main`, the real error path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.sim import FaultConfig, load_profile, start_simulator

ROOT = Path(__file__).resolve().parent.parent
LOADGEN = [sys.executable, "-m", "loadgen.cli"]


def sweep(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`loadgen sweep ARGS` in a subprocess, as a user runs it."""
    return subprocess.run([*LOADGEN, "sweep", *args], capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SIM_PROFILE = """name = "{name}"
model_alias = "{alias}"
prefill_tok_s = 20000.0
step_ms = {step_ms}
alpha = 0.25
n_ctx = 2048
eos_probability = 0.02
"""


def sim_profile(path: Path, name: str, step_ms: float, alias: str = "gate-sim") -> Path:
    """A simulator profile file: a server whose decode step takes `step_ms` (a throttled twin of
    another when only step_ms differs)."""
    path.write_text(SIM_PROFILE.format(name=name, alias=alias, step_ms=step_ms))
    return path


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections for as long as the block runs: bound, never
    listening. A port that was merely free a moment ago may be listened on by then."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def wait_healthy(url: str, timeout: float, proc: subprocess.Popen | None = None, what: str = "the server") -> None:
    """Return once GET url/health answers 200; raise RuntimeError when `timeout` s pass first or
    `proc` (the server's process, if given) exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} at {url} exited with {proc.returncode} before it answered /health")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} at {url} did not answer /health within {timeout} s")
        time.sleep(0.1)


def in_process_cli(monkeypatch: Any, capsys: Any) -> Callable[..., tuple[int, str, str]]:
    """`run(*ARGS)`: `loadgen ARGS` in-process through cli.main; returns (exit code, stdout, stderr)."""
    from loadgen import cli

    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)

    def run(*args: Any) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["loadgen", *map(str, args)])
        try:
            cli.main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


class SimProcess:
    """`with SimProcess("--profile", "smoke", ...) as sim:` `loadgen sim` in its own process at `sim.url`.

    It listens on a port of its own choosing (`--port 0`) and says where on stderr; `url` is given
    only once /health answers, and a simulator that never comes up is an error, not a URL. Stopped
    with SIGINT (as a user stops it), killed if it does not exit. `command` replaces `loadgen sim`.
    """

    def __init__(self, *args: str, ready_timeout: float = 30, command: tuple[str, ...] = (*LOADGEN, "sim")):
        self.args = ["--port", "0", *args]
        self.command = list(command)
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> "SimProcess":
        self.proc = proc = subprocess.Popen([*self.command, *self.args], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, text=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            line = proc.stderr.readline()
            if " on " not in line:
                raise RuntimeError(f"the simulator did not start: {line.strip() or proc.wait(10)}")
            self.url = line.split(" on ")[1].split(",")[0].strip()
            # Keep reading its stderr, so a chatty simulator never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, name="sim-stderr", daemon=True).start()
            wait_healthy(self.url, self.ready_timeout, proc, "the simulator")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> int | None:
        """SIGINT, then its exit code (killed after 10 s)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def __enter__(self) -> "SimProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
    try:
        wait_healthy(server.url, ready_timeout, proc, "llama-server")
    except RuntimeError as exc:
        server.stop()
        raise RuntimeError(f"{exc}: {log.read_text()[-2000:]}") from None
    return server


# --- in a background thread ---------------------------------------------------------------------

class LoopThread:
    """An event loop running in a daemon thread; `call(coro)` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="simbed", daemon=True)

    def __enter__(self) -> "LoopThread":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def call(self, coro: Awaitable[Any], timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class SimThread:
    """`with SimThread(faults=[...]) as sim:` a simulated llama-server at `sim.url`.

    `restart()` stops it and starts a fresh one on the same port, as a restarted server would be.
    """

    def __init__(self, profile: str = "smoke", *, faults: list[str] | tuple[str, ...] = (), slots: int = 4,
                 time_scale: float = 0.05, seed: int = 0, port: int = 0, **options: Any):
        self.profile = load_profile(profile)
        self.faults = FaultConfig.parse(faults)
        self.kwargs = dict(slots=slots, time_scale=time_scale, seed=seed, faults=self.faults, **options)
        self.port = port
        self._loop = LoopThread()
        self.sim: Any = None

    @property
    def url(self) -> str:
        return self.sim.url

    async def _start(self) -> None:
        self.sim = await start_simulator(self.profile, host="127.0.0.1", port=self.port, **self.kwargs)
        self.port = self.sim.port

    def start(self) -> None:
        self._loop.call(self._start())

    def stop(self) -> None:
        if self.sim is not None:
            self._loop.call(self.sim.stop())
            self.sim = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def completion_requests(self) -> int:
        """Completion requests the simulator has received (the index its faults are chosen by)."""
        return self.sim.server._n_requests

    def __enter__(self) -> "SimThread":
        self._loop.__enter__()
        try:
            self.start()
        except BaseException:
            self._loop.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._loop.__exit__(None, None, None)


class RawListener:
    """A TCP listener on 127.0.0.1 that answers every connection with `respond(first bytes read)`.

    `respond` returns the bytes to send (then the connection is closed) — e.g. an SSH banner, an
    echo of the request, or random garbage — or None to send nothing and close.
    """

    def __init__(self, respond: Callable[[bytes], bytes | None]):
        self.respond = respond
        self._loop = LoopThread()
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(reader.read(65536), 5)
            answer = self.respond(first)
            if answer:
                writer.write(answer)
                await writer.drain()
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            writer.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, family=socket.AF_INET)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def __enter__(self) -> "RawListener":
        self._loop.__enter__()
        self._loop.call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._loop.call(self._stop())
        finally:
            self._loop.__exit__(None, None, None)


class InstantServer:
    """`tests/instant_server.py` in its own process: answers every POST /completion at once (one
    canned llama.cpp response) and counts them (`count()`); for runs of hundreds of thousands of requests."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "InstantServer":
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "instant_server.py"), str(self.port)])
        wait_healthy(self.url, 30, self.proc, "the instant server")
        return self

    def count(self) -> int:
        with urllib.request.urlopen(f"{self.url}/count", timeout=10) as r:
            return int(r.read())

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
