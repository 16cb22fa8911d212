"""How a run of each kind is shown beyond a sweep's level tables: the kind's view.

core/kinds.py names each kind's view by import string (`Kind.view`); `view_of` finds a run's, so
the tables, exporters, `analyze` and `report` ask the view instead of listing kinds. A kind without
a view is shown as a sweep is (its levels' tables and verdicts, no answer line).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.kinds import KINDS
from ..core.rundoc import RunDocument, RunKind
from .layout import Grid


@dataclass(frozen=True, slots=True)
class KindView:
    """What a kind shows besides (or instead of) a sweep's level tables."""

    # A kind without levels: "module:function" drawing its one table from the run (imported when
    # drawn, as a kind is); None: the sweep's tables.
    table: str | None = None
    # Its exports write the rows of its section of run.json (core/kinds.py Kind.section), one per
    # `row_name` ("prompt length"), instead of levels; None: levels.
    row_name: str | None = None
    # Its answer in one sentence, said after the tables by `analyze` and first by `report`.
    answer: Callable[[Path, RunDocument], str | None] | None = None


    def draw_table(self, doc: RunDocument) -> Grid | None:
        """The kind's one table of this run, or None for a kind with levels."""
        if self.table is None:
            return None
        draw: Callable[[RunDocument], Grid] = _imported(self.table)
        return draw(doc)


SWEEP = KindView()  # a kind without a view of its own: a sweep's tables and verdicts


def rows_section(doc: RunDocument) -> str | None:
    """The section of run.json whose rows the run's exports write ("prefill", "depth"); None: levels."""
    return kind_of(doc).kind.section if view_of(doc).row_name is not None else None


def kind_of(doc: RunDocument) -> RunKind:
    """The kind that wrote the run; a run written before schema 4 by a command whose kind has levels
    said "sweep", and its command line names it."""
    if doc.kind is RunKind.SWEEP and doc.command and len(doc.command) > 1 and doc.command[1] in KINDS:
        named = RunKind(doc.command[1])
        if named.has_levels:
            return named
    return doc.kind


def view_of(doc: RunDocument) -> KindView:
    """The view of the run's kind (`kind_of`): the one its Kind names, or a sweep's."""
    where = KINDS[kind_of(doc).value].view
    if where is None:
        return SWEEP
    view = _imported(where)
    assert isinstance(view, KindView), where
    return view


def _imported(where: str) -> Any:
    """The object an import string ("module:attribute") names."""
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr)
