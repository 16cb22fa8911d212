"""The demo's simulated servers, each in a process of its own (`loadgen sim`), as real servers are.

On the client's event loop (as they once ran) every stall of that loop, a progress redraw or a
/metrics scrape, delayed the simulators' timers too, and the demo multiplies every duration by
1 / time scale (×17 at 0.06): a 30 ms hiccup became half a second of "queue wait", and requests
showed as queued at concurrency 2 of a 4-slot server, which a real server of that shape never
does. In their own processes the operating system schedules them beside the client, not after it.
"""

from __future__ import annotations

import contextlib
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

from ..core.errors import EXIT_FAILED, UserError
from ..core.processes import start_tied

READY_TIMEOUT_S = 60.0  # a loaded machine can take a while to import Python and bind


@contextlib.contextmanager
def simulator_processes(profiles: Sequence[str], *, slots: int, time_scale: float, seed: int) -> Iterator[list[str]]:
    """`loadgen sim` per profile, each on a port of its own choosing (`--port 0`, so no other
    process can take it first); their URLs, ready (/health 200), on entry; stopped (SIGINT) on exit."""
    procs: list[subprocess.Popen] = []
    try:
        for profile in profiles:
            procs.append(start_tied(
                [sys.executable, "-m", "loadgen", "sim", "--profile", profile, "--port", "0",
                 "--slots", str(slots), "--time-scale", repr(time_scale), "--seed", str(seed)],
                signal.SIGINT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        urls = [_listening_url(proc) for proc in procs]
        for proc, url in zip(procs, urls):
            _wait_ready(proc, url)
        yield urls
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def _listening_url(proc: subprocess.Popen) -> str:
    """The URL a simulator says it listens on: its first line on stderr ("... on http://HOST:PORT, ...")."""
    assert proc.stderr is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stderr], [], [], 0.1)
        if ready:
            line = proc.stderr.readline()
            break
    found = re.search(r" on (http://\S+?),", line)
    if found:
        return found.group(1)
    if proc.poll() is not None:
        rest = (line + (proc.stderr.read() or "")).strip().splitlines()
        raise UserError(f"a demo simulator did not start: {rest[-1] if rest else f'exit {proc.returncode}'}",
                        EXIT_FAILED)
    raise UserError(f"a demo simulator did not say where it listens within {READY_TIMEOUT_S:g} s", EXIT_FAILED)


def _wait_ready(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            message = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            raise UserError(f"a demo simulator did not start: {message[-1] if message else f'exit {proc.returncode}'}",
                            EXIT_FAILED)
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise UserError(f"a demo simulator did not answer /health within {READY_TIMEOUT_S:g} s", EXIT_FAILED)
