"""A `loadgen slots` run shown: one row per cycle (save, restore, the next turn against its
re-processed control, the verdict) and the answer line `analyze` and `report` say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text

from ..core.rundoc import RunDocument, SlotsSection
from .layout import Cell, Column, Grid, Num

_STYLE = {"restored": "green", "re-processed": "red", "failed": "red", "not faster": "yellow"}


def slots_table(doc: RunDocument | dict[str, Any]) -> Grid:
    """Per target × cycle: the slot, turn 1's prompt tokens, n_saved, save and restore ms, bytes per
    token, turn 2's cache_n and TTFT against the control's, the verdict."""
    doc = RunDocument.of(doc)
    grid = Grid("loadgen slots" + ("" if doc.complete else "  [incomplete]"), [
        Column("target", "left", key=True), Column("cycle", key=True), Column("slot"), Column("prompt\ntokens"),
        Column("n_saved"), Column("save\nms"), Column("restore\nms"), Column("bytes/\ntoken"),
        Column("cache_n\nturn 2"), Column("TTFT ms\nrestored"), Column("TTFT ms\nre-processed"),
        Column("verdict", "left")])
    for t in doc.targets:
        section = t.slots
        if section is None:
            continue
        for i, c in enumerate(section.rows):
            mark = grid.footnote(f"{t.label} cycle {i + 1}: {c.why}") if c.verdict != "restored" and c.why else ""
            cells: list[Cell] = [
                t.label if i == 0 else "", Num(i + 1), Num(c.slot), Num(c.prompt_tokens), Num(c.n_saved),
                Num(c.save_ms, 1), Num(c.restore_ms, 1), Num(c.bytes_per_token, 0), Num(c.cache_n),
                Num(c.ttft_ms, 0), Num(c.control_ttft_ms, 0), Text(c.verdict + mark, style=_STYLE.get(c.verdict, ""))]
            grid.add_row(*cells, end_section=i == len(section.rows) - 1)
    return grid


def section_line(label: str, s: SlotsSection) -> str:
    """One target's cycles in a sentence."""
    counts = ", ".join(f"{n} {v}" for v, n in s.by_verdict.items()) or "no cycle"
    load = f" beside {s.concurrency} request(s) on other slots" if s.concurrency else ""
    parts = [f"{label}: {counts} of {len(s.rows)} cycle(s){load}"]
    if s.save_ms is not None and s.restore_ms is not None:
        parts.append(f"save {s.save_ms:.1f} ms, restore {s.restore_ms:.1f} ms")
    if s.bytes_per_token is not None:
        parts.append(f"{s.bytes_per_token:,.0f} bytes per token")
    if s.ttft_restored_ms is not None and s.ttft_control_ms is not None:
        parts.append(f"TTFT {s.ttft_restored_ms:.0f} ms restored vs {s.ttft_control_ms:.0f} ms re-processed")
    return "; ".join(parts)


def slots_answer(path: Path, doc: RunDocument) -> str | None:
    """The run's answer, a sentence per target with cycles; None without any."""
    lines = [section_line(t.label, t.slots) for t in doc.targets if t.slots is not None]
    return "\n".join(lines) or None
