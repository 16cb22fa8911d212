"""A slots run's one table per target (a row per cycle) and its answer line."""

from __future__ import annotations

from ...output.kind_view import KindView
from ...output.slots import slots_answer

VIEW = KindView(table="loadgen.output.slots:slots_table", row_name="cycle", answer=slots_answer)
