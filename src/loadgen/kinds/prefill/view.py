"""A prefill run's one table per target (a row per prompt length), which its exports write."""

from __future__ import annotations

from ...output.kind_view import KindView

VIEW = KindView(table="loadgen.output.tables:prefill_table", row_name="prompt length")
