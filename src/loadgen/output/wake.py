"""A `loadgen wake` run shown: one row per cycle (slept after, TTFT warm and cold, the server's
prefill) and the answer line `analyze` and `report` say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text

from ..core.rundoc import RunDocument
from .layout import Cell, Column, Grid, Num


def wake_table(doc: RunDocument | dict[str, Any]) -> Grid:
    """Per target × cycle: whether and when the server slept, the warm and cold TTFT (median, and
    the cold request answered first), the server's prompt_ms and the wait outside it (TTFT less
    prompt_ms) warm and cold, failures."""
    doc = RunDocument.of(doc)
    grid = Grid("loadgen wake" + ("" if doc.complete else "  [incomplete]"), [
        Column("target", "left", key=True), Column("cycle", key=True), Column("slept\nafter s"),
        Column("TTFT ms\nwarm"), Column("TTFT ms\ncold"), Column("TTFT ms\ncold first"),
        Column("prompt_ms\nwarm"), Column("prompt_ms\ncold"), Column("wait ms\nwarm"), Column("wait ms\ncold"),
        Column("failed")])
    for t in doc.targets:
        section = t.wake
        if section is None:
            continue
        for i, c in enumerate(section.rows):
            slept: Cell = Num(c.slept_after_s, 1) if c.slept else Text("no", style="red")
            grid.add_row(t.label if i == 0 else "", Num(c.cycle), slept, Num(c.warm_ttft_ms, 0), Num(c.cold_ttft_ms, 0),
                         Num(c.cold_first_ttft_ms, 0), Num(c.warm_prompt_ms, 0), Num(c.cold_prompt_ms, 0),
                         Num(c.warm_wait_ms, 0), Num(c.cold_wait_ms, 0), Num(c.failed),
                         end_section=i == len(section.rows) - 1)
    return grid


def wake_answer(path: Path, doc: RunDocument) -> str | None:
    """The run's answer, a sentence per target: the verdict and why."""
    lines = [f"{t.label}: {t.wake.verdict}: {t.wake.why}" for t in doc.targets
             if t.wake is not None and t.wake.verdict is not None]
    return "\n".join(lines) or None
