"""Child processes that cannot outlive loadgen, whether a process still exists, and the cores this one may use."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable


def parent_death_signal_available() -> bool:
    """Does the kernel signal a child when its parent dies (Linux's PR_SET_PDEATHSIG)? Elsewhere a
    child loadgen must not leave behind is started through `core.watchdog`."""
    return sys.platform.startswith("linux")


def watchdog_argv(argv: list[str]) -> list[str]:
    """`argv` run under `core.watchdog`: its stdin must be a pipe only loadgen holds the write end of."""
    return [sys.executable, "-m", "loadgen.core.watchdog", "--", *argv]


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for a child loadgen starts (a demo simulator, an ab sweep, a grid's server): on
    Linux the kernel sends it `signum` when loadgen exits, however it exits (a second Ctrl-C leaves
    with os._exit, which runs no cleanup; SIGKILL runs none either), so no child outlives it.
    Elsewhere a no-op."""
    def arm() -> None:
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(1, int(signum))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    return arm


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pid_alive(pid: int) -> bool:
    """Does a process with this pid exist (a zombie not yet reaped counts)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
