"""A --lora-mix run's table: per target and level, each adapter's share of the requests, what its
requests got, and whether the server applied the adapter asked for (analysis/lora.py)."""

from __future__ import annotations

from collections.abc import Sequence

from ..analysis.lora import adapter_shares
from ..core.records import RequestRecord, level_short
from ..core.rundoc import RunDocument
from .layout import Column, Grid, Num


def lora_table(doc: RunDocument, records: Sequence[RequestRecord]) -> Grid | None:
    """The adapters' table of a --lora-mix run from its records; None for another run, or a run
    without records (kept only some: --records errors|none)."""
    if doc.config is None or doc.config.lora_mix is None:
        return None
    levels = adapter_shares(records)
    if not levels:
        return None
    grid = Grid(f"LoRA adapters per request (--lora-mix {doc.config.lora_mix})",
                [Column("target", key=True), Column("level", key=True), Column("adapter", key=True),
                 Column("requests"), Column("share\n%"), Column("ok"), Column("output\ntokens"),
                 Column("latency\np50 ms"), Column("applied\n(told)")])
    for lv in levels:
        for i, a in enumerate(lv.adapters):
            applied = ("not told" if not a.told else f"as asked ({a.told})" if not a.mismatched
                       else grid.footnote(f"{lv.target} {level_short(lv.level, doc.open_loop)} adapter {a.adapter}: "
                                          f"{len(a.mismatched)} of {a.told} requests applied other adapters than "
                                          f"asked (seq {', '.join(map(str, a.mismatched[:5]))})"))
            grid.add_row(lv.target, level_short(lv.level, doc.open_loop), a.adapter, Num(a.requests, None),
                         Num(lv.share(a) * 100, 0), Num(a.ok, None), Num(a.output_tokens, None),
                         Num(a.latency_p50_ms, 0), applied, end_section=i == len(lv.adapters) - 1)
    grid.caption = ("applied: what llama-server's answer (generation_settings.lora) says it applied; "
                    "the OpenAI APIs' answers do not say (not told)")
    return grid
