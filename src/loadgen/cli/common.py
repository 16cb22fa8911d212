"""Thin click commands that read results directories. What they share: one way to fail on bad input,
and the one way a command that writes a results directory names and prepares it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from ..core.errors import InputError, UserError
from ..core.processes import die_with_parent

__all__ = ["ReportedError", "die_with_parent", "results_dir", "results_folder", "user_errors"]


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
    """A results directory that exists (or a grid's cell named under the grid's folder: GRID/c01), or
    an InputError naming it."""
    from ..results.grid_file import is_grid

    path = Path(path_text)
    if not path.is_dir() and not is_grid(path.parent):
        prefix = f"{which} " if which else ""
        raise InputError(f"{prefix}{path}: no such directory; give a results directory written by `loadgen sweep`")
    return path


def results_folder(output: str | None, force: bool, command: str) -> Path:
    """--output, else results/<UTC time>-<command>, ready for a run (one that holds a run is refused
    without --force)."""
    from ..results.writer import default_dir, prepare_dir

    return prepare_dir(Path(output) if output else default_dir(Path("results"), command), force)
