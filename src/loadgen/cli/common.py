"""Thin click commands that read results directories. What they share: one way to fail on bad input."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from ..core.errors import InputError, UserError


class ReportedError(click.ClickException):
    """A `UserError` on its way out through click, which prints it as one line and exits with its
    code (also when click runs the command standalone). Not an error type of its own."""

    def __init__(self, error: UserError):
        super().__init__(str(error))
        self.exit_code = self.user_exit_code = error.exit_code


@contextmanager
def user_errors() -> Iterator[None]:
    """Errors in the user's input (any `UserError`) leave as one line and their exit code."""
    try:
        yield
    except UserError as exc:
        raise ReportedError(exc) from None


def results_dir(path_text: str, which: str = "") -> Path:
    """A results directory that exists, or an InputError naming it."""
    path = Path(path_text)
    if not path.is_dir():
        prefix = f"{which} " if which else ""
        raise InputError(f"{prefix}{path}: no such directory; give a results directory written by `loadgen sweep`")
    return path


def die_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn` for a child loadgen starts (a demo simulator, an ab sweep): on Linux the kernel
    sends it `signum` when loadgen exits, however it exits (a second Ctrl-C leaves with os._exit,
    which runs no cleanup), so no child outlives it. Elsewhere a no-op."""
    def arm() -> None:
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(1, int(signum))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    return arm
