"""Child processes that cannot outlive loadgen, whether a process still exists, and the cores this one may use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .facilities import linux_facilities


def parent_death_signal_available() -> bool:
    """Does the kernel signal a child when its parent dies (Linux's PR_SET_PDEATHSIG)? Elsewhere a
    child loadgen must not leave behind is started through `core.watchdog`. Off with the others under
    LOADGEN_LINUX_FACILITIES=off (core/facilities.py)."""
    return linux_facilities()


def watchdog_argv(argv: list[str]) -> list[str]:
    """`argv` run under `core.watchdog`: its stdin must be a pipe only loadgen holds the write end of."""
    return [sys.executable, "-m", "loadgen.core.watchdog", "--", *argv]


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for a child loadgen starts (a demo simulator, an ab sweep, a grid's server): on
    Linux the kernel sends it `signum` when loadgen exits, however it exits (a second Ctrl-C leaves
    with os._exit, which runs no cleanup; SIGKILL runs none either), so no child outlives it.
    Elsewhere (and under LOADGEN_LINUX_FACILITIES=off) a no-op."""
    if not parent_death_signal_available():
        return lambda: None

    def arm() -> None:
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(1, int(signum))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    return arm


class TiedPopen(subprocess.Popen):
    """A child started by `start_tied`. Under the watchdog (`watched`) a signal sent to it goes to its
    process group, so it reaches the program: the watchdog itself ignores SIGTERM and SIGINT and ends
    as its program did."""

    watched = False

    def send_signal(self, sig: int) -> None:
        if not self.watched:
            super().send_signal(sig)
        elif self.poll() is None:
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass


def start_tied(argv: Sequence[str], signum: int = signal.SIGTERM, **kwargs: Any) -> TiedPopen:
    """Start `argv` (Popen's keywords, no preexec_fn) so that it cannot outlive loadgen: with the
    kernel's parent-death signal `signum` (Linux), else under `core.watchdog` in a session of its own
    (the watchdog ends its group), the watchdog's stdin a pipe whose write end only this process holds
    (os.pipe's ends are not inherited): closed when loadgen exits however it exits, or when the
    returned object is collected. Under the watchdog the program's stdin is /dev/null, whatever
    `stdin` says."""
    if parent_death_signal_available():
        return TiedPopen(list(argv), preexec_fn=die_with_parent(signum), **kwargs)
    read, write = os.pipe()
    try:
        proc = TiedPopen(watchdog_argv(list(argv)), **{**kwargs, "stdin": read, "start_new_session": True})
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    proc.watched = True
    weakref.finalize(proc, os.close, write)
    return proc


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
