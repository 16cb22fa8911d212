"""How a capacity run is shown beyond its levels' tables: its answer, capacity.json's sentence (or
rebuilt from run.json), said after the tables by `analyze` and first by `report`."""

from __future__ import annotations

from ...output.capacity_answer import answer_line
from ...output.kind_view import KindView

VIEW = KindView(answer=answer_line)
