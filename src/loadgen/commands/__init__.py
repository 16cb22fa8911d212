"""Thin click commands that read results directories. What they share: one way to fail on bad input."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

EXIT_USAGE = 2


class InputError(click.ClickException):
    """One line for the user, exit code 2 (also when click runs the command standalone)."""

    exit_code = EXIT_USAGE


@contextmanager
def user_errors(*kinds: type[Exception]) -> Iterator[None]:
    """Turn the given exception types (errors in the user's input) into an InputError."""
    try:
        yield
    except kinds as exc:
        raise InputError(str(exc)) from None


def results_dir(path_text: str, which: str = "") -> Path:
    """A results directory that exists, or an InputError naming it."""
    path = Path(path_text)
    if not path.is_dir():
        prefix = f"{which} " if which else ""
        raise InputError(f"{prefix}{path}: no such directory; give a results directory written by `loadgen sweep`")
    return path
