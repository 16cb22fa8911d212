"""`analyze --percentiles`: a saved run's levels given the chosen percentiles from its records, as
`sweep --percentiles` would have kept them (analysis/aggregate.py, the same histograms).

Only the percentiles are recomputed: every other figure of a level stays as run.json has it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ..analysis.aggregate import LevelAggregate
from ..core.records import RequestRecord


def with_percentiles(doc: dict[str, Any], records: Sequence[RequestRecord], qs: Sequence[float]) -> dict[str, Any]:
    """`doc` (run.json's content, changed in place and returned) with each level's "percentiles"
    of `qs` from its records (run.json's own, if any, replaced) and the config's "percentiles"."""
    by_level: dict[tuple[str, float], list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_level[r.target, r.level].append(r)
    for target in doc["targets"]:
        for level in target.get("levels") or []:
            rs = by_level.get((target["label"], level["level"]), [])
            chosen = LevelAggregate.of(rs).summary(level["concurrency"], percentiles=qs).percentiles
            level["percentiles"] = chosen or {}
    doc.setdefault("config", {})["percentiles"] = list(qs)
    return doc
