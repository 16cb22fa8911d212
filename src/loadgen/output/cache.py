"""The cache table: per level, how much of the prompts the server reused and what it changed
(run.json's per-level cache figures, analysis/cache.py), under the cache mode the run asked for.

Shown for a run whose config names a cache mode (core/cache_mode.py) only: a normal run sends
`cache_prompt: false` and reuses nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.cache import CapacitySummary, TurnFigures, conversation_turns
from ..core.griddoc import CacheCapacityEntry
from ..core.records import RequestRecord
from ..core.rundoc import CacheMode, Distribution, RunDocument
from .layout import Column, Grid, Num


def cache_title(cache: CacheMode) -> str:
    """The mode in one line, cache_prompt said first."""
    state = "cache_prompt ON" if cache.cache_prompt else "cache_prompt OFF (the uncached run to read beside a cached one)"
    return f"{state}: {cache.shape}" if cache.kind in ("shared_prefix", "multi_turn") else state


def cache_table(doc: RunDocument | dict[str, Any]) -> Grid | None:
    """Per target and level: the token-weighted hit ratio, cache_n p50, TTFT p50 of hits and misses,
    prefill saved; None for a run without a cache mode."""
    doc = RunDocument.of(doc)
    cache = doc.config.cache_mode if doc.config is not None else None
    if cache is None:
        return None
    grid = Grid(f"prompt cache ({cache_title(cache)})",
                [Column("target", "left", key=True), Column("req/s" if doc.open_loop else "C", key=True),
                 Column("hit ratio\n%"), Column("cache_n\np50"), Column("prompt_n\np50"),
                 Column("TTFT hit\np50 ms"), Column("TTFT miss\np50 ms"), Column("prefill\nsaved s")])
    last = None
    for t in doc.targets:
        for lv in t.levels:
            ratio, saved = lv.cache_hit_ratio, lv.prefill_saved_ms
            # No cache figures at all: nothing was reused (cache off, or every request missed), unless
            # no request succeeded: then nothing is known (n/a).
            none = 0.0 if lv.requests_ok else None
            miss = lv.ttft_cache_miss_ms if ratio is not None else lv.ttft_ms
            grid.add_row(t.label if t.label != last else "", Num(lv.level, None),
                         Num(none if ratio is None else ratio * 100, 1),
                         Num(lv.cache_n.p50 if lv.cache_n is not None else (none if ratio is None else None), 0),
                         Num(_p50(lv.prompt_n), 0), Num(_p50(lv.ttft_cache_hit_ms), 1), Num(_p50(miss), 1),
                         Num(None if saved is None else saved / 1000, 2))
            last = t.label
    return grid


def _p50(d: Distribution | None) -> float | None:
    return None if d is None else d.p50


def turn_table(label: str, figures: list[TurnFigures]) -> Grid:
    """A multi-turn run's figures per turn index (analysis/cache.turn_figures): prompt tokens (whole),
    reused tokens, hit ratio, TTFT and latency p50, the slots that served the turn."""
    grid = Grid(f"{label}: per turn (medians over the users; prompt = cache_n + prompt_n)",
                [Column("turn", key=True), Column("requests"), Column("prompt\ntokens"), Column("cache_n"),
                 Column("hit ratio\n%"), Column("TTFT\nms"), Column("latency\nms"), Column("slots", "left")])
    for f in figures:
        grid.add_row(Num(f.turn, None), Num(f.requests, None), Num(f.prompt_tokens_p50, 0), Num(f.cache_n_p50, 0),
                     Num(None if f.hit_ratio is None else f.hit_ratio * 100, 1), Num(f.ttft_ms_p50, 1),
                     Num(f.latency_ms_p50, 1), ",".join(map(str, f.slots)) or "n/a")
    return grid


def turn_tables(doc: RunDocument | dict[str, Any], records: Sequence[RequestRecord]) -> list[Grid]:
    """A multi-turn run's per-turn table per target, from its records: the one `loadgen chat` prints
    at the end of the run, and `analyze`, `report` again from the run's folder (every record: a folder
    that kept only some, --records errors|none, has no per-turn table, `kept_records`). None for
    another run."""
    doc = RunDocument.of(doc)
    cache = doc.config.cache_mode if doc.config is not None else None
    if cache is None or cache.kind != "multi_turn" or not cache.users:
        return []
    grids = []
    for t in doc.targets:
        figures = conversation_turns([r for r in records if r.target == t.label], cache.users)
        if figures:
            grids.append(turn_table(t.label, figures))
    return grids


def kept_records(doc: RunDocument | dict[str, Any], records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """A run folder's records for the tables drawn from them: all of them, or none where the run kept
    only some (--records errors|none), whose figures would be of those alone."""
    config = RunDocument.of(doc).config
    return list(records) if config is None or config.records == "all" else []


def cache_capacity_table(summary: CapacitySummary | CacheCapacityEntry) -> Grid:
    """A cache-capacity run (cache-capacity.json, as the run made it or as read back): per K, the warm rounds' hit ratio and TTFT, the server's RSS;
    the K where reuse collapsed beside the predicted capacity, in the footnotes."""
    grid = Grid(f"prompt-cache capacity: conversations of {summary.conversation_tokens} tokens, "
                f"{summary.slots} slots, cache_prompt ON",
                [Column("K", key=True), Column("warm\nrequests"), Column("hit ratio\n%"), Column("TTFT p50\nms"),
                 Column("server RSS\nMiB")])
    for lv in summary.levels:
        ratio = lv.warm_hit_ratio
        grid.add_row(Num(lv.k, None), Num(lv.warm_requests, None),
                     Num(None if ratio is None else ratio * 100, 1), Num(lv.warm_ttft_ms_p50, 1),
                     Num(lv.rss_mib, 0))
    predicted = summary.predicted_capacity
    if not summary.complete:
        grid.footnotes.append("incomplete: the run stopped early; these are the Ks that finished")
    grid.footnotes.append(collapse_line(summary))
    grid.footnotes.append(f"predicted: {predicted} conversations stay warm ({_prediction_basis(summary)}), "
                          f"so collapse at K = {predicted + 1}" if predicted is not None
                          else "no prediction: give --cache-ram-mib and --bytes-per-token")
    return grid


def collapse_line(summary: CapacitySummary | CacheCapacityEntry) -> str:
    """A cache-capacity run's answer in one line: where reuse collapsed."""
    collapsed = summary.collapse_k
    return f"reuse collapsed at K = {collapsed}" if collapsed is not None else "reuse did not collapse at any K measured"


def _prediction_basis(summary: CapacitySummary | CacheCapacityEntry) -> str:
    """What the predicted capacity counted: the slots alone unless a host cache was given."""
    if summary.cache_ram_mib is None:
        return "slots only: no --cache-ram-mib given"
    if summary.cache_ram_mib == 0:
        return "slots only: --cache-ram-mib 0"
    return "the slots and the saved slot states --cache-ram holds"
