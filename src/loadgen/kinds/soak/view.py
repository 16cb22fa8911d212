"""A soak run's one table per target (its windows and drift)."""

from __future__ import annotations

from ...output.kind_view import KindView

VIEW = KindView(table="loadgen.output.tables:soak_table")
