"""Errors a user can cause, and the exit codes loadgen ends with: one hierarchy, one set.

A `UserError` (a bad flag, an unreadable results directory, runs that cannot be compared, ...)
ends at the command line as one line, `loadgen: error: <message>`, and its `exit_code`. Anything
else that escapes is loadgen's own bug and keeps its traceback.
"""

from __future__ import annotations

EXIT_OK = 0  # the run ran (request failures are counted and shown, not fatal); the gate passed
EXIT_FAILED = 1  # a target was unreachable or went down, the results could not be written; the gate found a regression
EXIT_USAGE = 2  # bad input: flags, scenario files, results directories
EXIT_NOT_ENFORCED = 3  # the gate could enforce none of its limits (checks untested, or blind to a change that size)
EXIT_ENV_CHANGED = 4  # compare/gate/ab: the machine under the two sides differs, or changed during a level (docs/environment.md)
EXIT_SIGINT = 130  # stopped by SIGINT (Ctrl-C); the results so far are written and marked incomplete
EXIT_SIGTERM = 143  # stopped by SIGTERM; likewise


class UserError(Exception):
    """An error the user can fix; the message is one sentence that says what to change."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(UserError, ValueError):
    """Bad flags, scenario keys or prompt sources, caught before a request is sent."""


class InputError(UserError):
    """A bad argument of a command that reads results (a missing directory, an unknown format)."""


class ResultsError(UserError):
    """A results directory that cannot be read or written."""
