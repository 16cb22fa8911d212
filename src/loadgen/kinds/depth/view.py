"""A depth run's one table per target (a row per depth), which its exports write."""

from __future__ import annotations

from ...output.kind_view import KindView

VIEW = KindView(table="loadgen.output.tables:depth_table", row_name="depth")
