"""A child (a grid's server or measurement, ab's sweep, demo's simulator, a bisect build) that cannot
outlive loadgen where the kernel has no parent-death signal (macOS, BSD; `core.processes.start_tied`).

On Linux `core.processes.die_with_parent` asks the kernel (PR_SET_PDEATHSIG) to signal a child when
loadgen exits. Elsewhere loadgen starts the server through this wrapper instead:

    python -m loadgen.core.watchdog -- llama-server --port 8080 ...

The wrapper's stdin is a pipe whose write end only loadgen holds. It starts the server in its own
process group (the one loadgen gave it: start_new_session) and waits. When the pipe closes (loadgen
exited, however: a SIGKILL closes its descriptors too) it sends SIGTERM to the group, SIGKILL after
a grace period. When the server exits first, the wrapper exits with the server's status (a signal
that ended the server ends the wrapper too), so the caller sees the server's exit as its own.
SIGTERM and SIGINT sent to the group reach the server directly; the wrapper outlives them to report
its child's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 10.0


def watch_pipe(fd: int, child: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """Block until `fd` reaches end of file, then end the process group: SIGTERM, SIGKILL after `grace_s`."""
    while True:
        try:
            if not os.read(fd, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    if child.poll() is not None:
        return
    group = os.getpgrp()
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if child.poll() is None:
        _signal_group(group, signal.SIGKILL)  # ends the wrapper too


def _signal_group(group: int, signum: int) -> None:
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        pass


def _default_signals() -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m loadgen.core.watchdog -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)  # the server gets them through the group; we report its status
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=_default_signals)
    except OSError as exc:
        print(f"could not run {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    threading.Thread(target=watch_pipe, args=(sys.stdin.fileno(), child), daemon=True).start()
    code = child.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
