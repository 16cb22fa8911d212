"""A wake run's section of a target in run.json (core/rundoc.py `WakeSection`), written typed."""

from __future__ import annotations

from typing import Any

import msgspec

from ...analysis.wake import wake_section
from ...run.state import Run, TargetRun


def section(t: TargetRun, run: Run) -> dict[str, Any]:
    settings = run.settings_dict()
    built = wake_section(list(t.wake_cycles), int(settings.get("concurrency", 1)), float(settings.get("idle_s", 0.0)),
                         run.interrupted)
    return msgspec.to_builtins(built)
