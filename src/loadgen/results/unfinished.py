"""A run killed outright (kill -9, a crash): the level it was running, summarised from its records.

run.json is rewritten after every level and every few seconds, but a run killed between two writes
leaves its last level missing from it, or saved as "in progress" with the figures of an earlier
moment, while requests.jsonl holds every record written up to the kill. A reader (`analyze`,
`report`) summarises such a level from those records and marks it (`KILLED_DURING_LEVEL` as its
stopped reason), so it is never dropped and never taken for a finished one. Only a run whose
run.json says it did not finish (`"complete": false`) is touched; a run stopped by Ctrl-C has its
levels summarised already.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.aggregate import summarize_level
from ..core.records import RequestRecord
from ..core.rundoc import KILLED_DURING_LEVEL, RunKind, is_open_loop

IN_PROGRESS = "in progress"  # how a checkpoint saves a level still running (results/writer.py)


def _has_levels(kind: Any) -> bool:
    try:
        return RunKind(kind).has_levels
    except ValueError:  # not a kind: the contract check names it
        return False


def summarise_killed_levels(doc: dict[str, Any], records: Sequence[RequestRecord]) -> list[tuple[str, int | float]]:
    """Summarise, in `doc`, every level of an unfinished run that has records but no finished
    summary; the (target, level) of each (output/tables.py `killed_lines` says them)."""
    if doc.get("complete", True) is not False or not _has_levels(doc.get("kind", "sweep")):
        return []
    open_loop = is_open_loop(doc)
    cap = (doc.get("config") or {}).get("max_in_flight") or 0
    done = []
    known = {t.get("label") for t in doc["targets"]}
    for label in dict.fromkeys(r.target for r in records):  # killed before its first checkpoint named them
        if label not in known:
            doc["targets"].append({"label": label, "url": None, "server": None, "error": None, "levels": [],
                                   "verdict": None})
    for t in doc["targets"]:
        by_level: dict[int | float, list[RequestRecord]] = {}
        for r in records:
            if r.target == t["label"]:
                by_level.setdefault(r.level, []).append(r)
        levels = t.setdefault("levels", [])
        summarised = {lv["level"]: i for i, lv in enumerate(levels)}
        for key, rs in by_level.items():
            at = summarised.get(key)
            if at is not None and levels[at].get("stopped_reason") != IN_PROGRESS:
                continue
            summary = summarize_level(cap if open_loop else int(key), rs, KILLED_DURING_LEVEL,
                                      rate=key if open_loop else None).to_dict()
            if at is None:
                levels.append(summary)
            else:
                levels[at] = {**levels[at], **summary}  # what the checkpoint said beside (the workers') kept
            done.append((t["label"], key))
    return done
