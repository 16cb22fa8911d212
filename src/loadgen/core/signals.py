"""SIGINT and SIGTERM from the moment a measurement starts until the process exits.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be,
and whenever a handler is removed (an event loop closing, the interpreter shutting down) a signal
gets the default action and ends the process *by* that signal (return code -2), however well the
data was saved. So loadgen holds both signals from the start of a run to the exit: each one is
recorded and handed to whoever listens (the running measurement); the exit code is the first
one's (130 for SIGINT, 143 for SIGTERM); and on the way out, once one came, any further one is
ignored (CPython resets handlers to the default action at shutdown, but leaves ignored ones).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from .errors import EXIT_SIGINT, EXIT_SIGTERM

# keyed by int: a signal arrives as its number, and signal.Signals members are ints
SIGNAL_EXIT: dict[int, int] = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}


class SignalLatch:
    """Records SIGINT/SIGTERM while installed; one per process (signals are per process)."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] | None = None
        self._listener: Callable[[int], None] | None = None

    def install(self) -> None:
        """Take both signals (again after a release, with a fresh record)."""
        if self._previous is None:
            self.received = []
            self._previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNAL_EXIT}

    def listen(self, listener: Callable[[int], None] | None) -> None:
        """Hand each later signal to `listener` too (None: only record them)."""
        self._listener = listener

    @property
    def exit_code(self) -> int | None:
        return SIGNAL_EXIT.get(self.received[0], EXIT_SIGINT) if self.received else None

    def release(self) -> None:
        """At the end of a command: once a signal came, ignore the rest until exit; else give the
        signals back to whoever had them (the in-process tests, an embedding program)."""
        if self._previous is None:
            return
        self._listener = None
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_IGN if self.received else handler)
        self._previous = None

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._listener is not None:
            self._listener(signum)


LATCH = SignalLatch()
