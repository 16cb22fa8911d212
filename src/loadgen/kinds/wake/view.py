"""A wake run's one table per target (a row per cycle) and its answer line."""

from __future__ import annotations

from ...output.kind_view import KindView
from ...output.wake import wake_answer

VIEW = KindView(table="loadgen.output.wake:wake_table", row_name="cycle", answer=wake_answer)
