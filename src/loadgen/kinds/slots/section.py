"""A slots run's section of a target in run.json (core/rundoc.py `SlotsSection`)."""

from __future__ import annotations

from typing import Any

import msgspec

from ...analysis.slots import CycleFigures, cycle_verdict, summarize_slots
from ...core.rundoc import SlotCycle
from ...run.state import Run, TargetRun


def section(t: TargetRun, run: Run) -> dict[str, Any]:
    """A `loadgen slots` target's section (core.rundoc.SlotsSection): each cycle with its verdict,
    the figures over them (analysis/slots.py), and how the background requests fared."""
    settings = run.settings_dict()
    cycles: list[CycleFigures] = list(t.slot_cycles)
    rows = []
    for c in cycles:
        verdict, why = cycle_verdict(c)
        ok = sum(x is not None for x in (c.prompt_tokens, c.cache_n, c.control_cache_n))
        rows.append(msgspec.to_builtins(SlotCycle(
            c.slot, verdict, why, ok, c.prompt_tokens, c.n_saved, c.n_written, c.save_ms, c.n_restored, c.n_read,
            c.restore_ms, c.cache_n, c.ttft_ms, c.control_cache_n, c.control_ttft_ms, c.file_bytes,
            c.bytes_per_token)))
    summary = summarize_slots(cycles)
    background = [r for lv in t.levels[1:] for r in lv.records]
    return {"rows": rows, "concurrency": settings.get("concurrency", 0), "forget": settings.get("forget", "erase"),
            "verdict": summary.verdict if cycles else None, "by_verdict": summary.by_verdict,
            "save_ms": summary.save_ms, "restore_ms": summary.restore_ms,
            "bytes_per_token": summary.bytes_per_token, "ttft_restored_ms": summary.ttft_restored_ms,
            "ttft_control_ms": summary.ttft_control_ms,
            "background_ok": sum(r.ok for r in background),
            "background_failed": sum(not r.ok for r in background)}
