"""Prompt-cache figures: how much of the prompts the server reused, and what that saved.

Pure functions over recorded requests (no I/O). llama-server's `timings` split a prompt in two:
`cache_n`, the tokens reused from a slot's (or the host's) prompt cache, and `prompt_n`, the
tokens it computed (≥ 1: the last prompt token is always computed, its logits give the first
answer token). A request's whole prompt is therefore `cache_n + prompt_n`.

    hit ratio (token-weighted) = Σ cache_n / Σ (cache_n + prompt_n)     over successful requests
    a cache hit                = a request with cache_n ≥ HIT_SHARE × (cache_n + prompt_n)
    prefill cost per token     = Σ prompt_ms / Σ prompt_n      at the run's lowest level
    prefill saved (ms)         = Σ cache_n × prefill cost per token
                                 (the reused tokens at the prefill cost per computed token measured
                                 at the run's lowest level, its runs pooled: an estimate, since
                                 prefill cost grows with depth)

Why the lowest level's cost: llama-server batches the prompts of requests that arrive together,
and each request's `prompt_ms` is the whole batch's prefill time, so above c=1 Σ prompt_ms counts
a batched prefill once per request in it (two prompts batched at c=2 report twice the time they
took). Priced at its own level's cost the same cached tokens "saved" twice as much at c=2 as at
c=1; priced at the lowest level's (c=1: a prompt prefilled alone), they save the same at every
level. A summary of one level alone (`cache_figures`, a level summarised by itself) is its own
lowest level.

Requests without timings (an OpenAI-style server without them) count in none of these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..core.records import RequestRecord

# Half the prompt or more reused: the shared prefix or the history, not the BOS token and a few
# template tokens every prompt has in common.
HIT_SHARE = 0.5


def is_hit(cache_n: int | None, prompt_n: int | None) -> bool | None:
    """Whether a request reused at least HIT_SHARE of its prompt; None without both counts."""
    if cache_n is None or prompt_n is None:
        return None
    return cache_n >= HIT_SHARE * (cache_n + prompt_n) and cache_n > 0


def hit_ratio(cache_total: float, computed_total: float) -> float | None:
    """Σ cache_n / Σ (cache_n + prompt_n); None when no prompt token was counted."""
    whole = cache_total + computed_total
    return None if whole <= 0 else cache_total / whole


def prefill_ms_per_token(computed_total: float, prompt_ms_total: float) -> float | None:
    """Σ prompt_ms / Σ prompt_n: the measured prefill cost of a computed token; None without one."""
    if computed_total <= 0:
        return None
    return prompt_ms_total / computed_total


def lowest_level_prefill_ms_per_token(levels: Iterable[tuple[int | float, float, float]]) -> float | None:
    """The run's prefill cost per computed token, from (level, Σ prompt_n, Σ prompt_ms) of each level
    run (a repeated level once per run): that of the lowest level that computed a token, its runs
    pooled; None when no level did."""
    measured = [(level, computed, ms) for level, computed, ms in levels if computed > 0]
    if not measured:
        return None
    lowest = min(level for level, _, _ in measured)
    return prefill_ms_per_token(sum(c for lv, c, _ in measured if lv == lowest),
                                sum(ms for lv, _, ms in measured if lv == lowest))


def prefill_saved_ms(cache_total: float, ms_per_token: float | None) -> float | None:
    """The prefill time the reused tokens would have cost at `ms_per_token` (the run's lowest level's,
    `lowest_level_prefill_ms_per_token`); None without a measured cost."""
    return None if ms_per_token is None else cache_total * ms_per_token


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """One group of requests' cache figures (see the module docstring); counts of successful
    requests with timings."""

    requests: int
    hits: int
    cache_n_total: int
    prompt_n_total: int  # computed tokens (llama-server's prompt_n)
    hit_ratio: float | None
    prefill_saved_ms: float | None


def cache_figures(records: Iterable[RequestRecord]) -> CacheFigures:
    """The token-weighted hit ratio, hits, and prefill saved of the successful requests with timings."""
    timed = [r for r in records if r.ok and r.cache_n is not None and r.prompt_n is not None]
    cache = sum(r.cache_n or 0 for r in timed)
    computed = sum(r.prompt_n or 0 for r in timed)
    prompt_ms = sum(r.prompt_ms or 0.0 for r in timed)
    return CacheFigures(len(timed), sum(1 for r in timed if is_hit(r.cache_n, r.prompt_n)), cache, computed,
                        hit_ratio(cache, computed), prefill_saved_ms(cache, prefill_ms_per_token(computed, prompt_ms)))


@dataclass(frozen=True, slots=True)
class TurnFigures:
    """One turn index of a multi-turn run, over its users' requests: prompt tokens (whole: cache_n +
    prompt_n), reused tokens, TTFT and latency (medians, ms; None when none measured), slots used."""

    turn: int
    requests: int
    prompt_tokens_p50: float | None
    cache_n_p50: float | None
    hit_ratio: float | None
    ttft_ms_p50: float | None
    latency_ms_p50: float | None
    slots: tuple[int, ...]


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def turn_of(record: RequestRecord, users: int) -> int:
    """A multi-turn record's turn, 1-based (run/multiturn.py numbers seq = turn × users + user)."""
    return record.seq // users + 1


def conversation_turns(records: Iterable[RequestRecord], users: int) -> list[TurnFigures]:
    """A multi-turn run's per-turn figures from its records (one target's), the table `loadgen chat`
    prints at the end of the run and `analyze` prints again from the run's folder."""
    return turn_figures((turn_of(r, users), r) for r in records)


def turn_figures(turns: Iterable[tuple[int, RequestRecord]]) -> list[TurnFigures]:
    """Per turn index (1-based, as given with each record), the figures of its successful requests,
    in turn order: a cold first turn is never pooled with a warm tenth."""
    by_turn: dict[int, list[RequestRecord]] = {}
    for turn, r in turns:
        by_turn.setdefault(turn, []).append(r)
    out = []
    for turn in sorted(by_turn):
        ok = [r for r in by_turn[turn] if r.ok]
        timed = [r for r in ok if r.cache_n is not None and r.prompt_n is not None]
        ttfts = [(r.first_token_ns - r.start_ns) / 1e6 for r in ok if r.first_token_ns is not None]
        figures = cache_figures(timed)
        out.append(TurnFigures(
            turn=turn, requests=len(ok),
            prompt_tokens_p50=_median([(r.cache_n or 0) + (r.prompt_n or 0) for r in timed]),
            cache_n_p50=_median([r.cache_n or 0 for r in timed]), hit_ratio=figures.hit_ratio,
            ttft_ms_p50=_median(ttfts), latency_ms_p50=_median([(r.complete_ns - r.start_ns) / 1e6 for r in ok]),
            slots=tuple(sorted({r.id_slot for r in ok if r.id_slot is not None and r.id_slot >= 0}))))
    return out


@dataclass(frozen=True, slots=True)
class CapacityLevel:
    """One K of a capacity run: K conversations taking turns, the warm rounds' figures (records
    from the second round on: seq ≥ K), the server's resident memory after the level (MiB; None
    when not known)."""

    k: int
    warm_requests: int
    warm_hit_ratio: float | None
    warm_ttft_ms_p50: float | None
    rss_mib: float | None = None


def capacity_level(k: int, records: Iterable[RequestRecord], rss_mib: float | None = None) -> CapacityLevel:
    """The warm rounds of a level of K round-robin conversations: request i is conversation i mod K,
    so the first K requests are each conversation's cold first turn and are left out."""
    warm = [r for r in records if r.seq >= k and r.ok]
    figures = cache_figures(warm)
    ttfts = [(r.first_token_ns - r.start_ns) / 1e6 for r in warm if r.first_token_ns is not None]
    return CapacityLevel(k, len(warm), figures.hit_ratio, _median(ttfts), rss_mib)


@dataclass(frozen=True, slots=True)
class CapacitySummary:
    """A cache-capacity run as cache-capacity.json holds it (`to_dict`, field order = file order):
    the conversations' size, the rounds, the server's slots, the cache RAM, bytes per token and
    server modes it was given, the predicted capacity and the K where reuse collapsed (None: not
    known), each K; `complete` False when the run stopped early (Ctrl-C, the server down) and holds
    the finished Ks only."""

    conversation_tokens: int
    rounds: int
    slots: int
    cache_ram_mib: float | None
    bytes_per_token: float | None
    cache_idle_slots: bool
    kv_unified: bool
    predicted_capacity: int | None
    collapse_k: int | None
    levels: list[CapacityLevel]
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Reuse has collapsed at a K whose warm hit ratio fell below this share of the best K's.
COLLAPSE_SHARE = 0.5


def collapse_k(levels: Sequence[CapacityLevel]) -> int | None:
    """The smallest K whose warm hit ratio is below COLLAPSE_SHARE × the highest ratio of the
    smaller Ks (None: no K collapsed, or no K reused anything). A K without a successful warm
    request tells nothing and is passed over."""
    best = 0.0
    for level in sorted(levels, key=lambda lv: lv.k):
        if level.warm_requests == 0:
            continue
        ratio = level.warm_hit_ratio or 0.0
        if best > 0 and ratio < COLLAPSE_SHARE * best:
            return level.k
        best = max(best, ratio)
    return None


# llama-server's host-memory prompt cache (`--cache-ram`), as build 11434's source has it
# (tools/server/server-task.cpp, server_prompt_cache; tools/server/server-context.cpp, server_slot's
# prompt_save and get_available_slot): an entry is a slot's whole saved sequence state
# (llama_state_seq_get_size_ext), its prompt and the answer tokens decoded after it. Per cell the KV
# rows plus its position, seq-id count and seq id (src/llama-kv-cache.cpp, state_write_meta); per entry
# a header of 4 bytes per stream and 24 per layer (state_write, state_write_data), under this
# allowance up to 80 layers and 8 slots.
CELL_META_BYTES = 12
ENTRY_HEADER_BYTES = 2048
# server_prompt_cache::load restores no entry of which less than this share matches the new prompt.
RESTORE_MIN_KEEP = 0.25


def prompt_cache_entry_bytes(cells: int, bytes_per_token: float) -> int:
    """A host-cache entry's bytes for a slot holding `cells` tokens (prompt + answer - 1: the last
    answer token is sampled, never decoded): cells x (KV bytes per token + CELL_META_BYTES) + the
    header allowance."""
    return math.ceil(cells * (bytes_per_token + CELL_META_BYTES)) + ENTRY_HEADER_BYTES


def prompt_cache_entries(cache_ram_mib: float, entry_bytes: int) -> int:
    """How many entries of `entry_bytes` the host cache holds under `--cache-ram` (MiB): it evicts the
    oldest until the new entry fits beside the rest, and never saves one larger than the limit."""
    return int(cache_ram_mib * 2**20 // entry_bytes) if entry_bytes > 0 else 0


def warm_conversations(slots: int, entries: int, cache_idle_slots: bool = True, kv_unified: bool = False) -> int:
    """Round-robin conversations kept warm by `slots` and a host cache of `entries`. A slot taking a
    new conversation saves its own before restoring the next one (the restored entry leaves the
    cache), so the entry needed next is the oldest and is evicted first: slots + entries - 1. With
    cache_idle_slots (llama-server's default) every idle slot is saved when a task starts, so the
    cache holds copies of what the slots hold: all conversations but the one just served must fit,
    entries + 1, or the slots alone; on a unified KV cache the idle slots are also cleared (saved or
    not), so only the cache and the slot just used keep any: entries + 1."""
    saves_idle = cache_idle_slots and slots > 1
    if saves_idle and kv_unified:
        return entries + 1
    if entries == 0:
        return slots
    return max(slots, entries + 1) if saves_idle else slots + entries - 1


def predicted_capacity(slots: int, slot_ctx: int | None, prompt_tokens: int, answer_tokens: int,
                       cache_ram_mib: float | None, bytes_per_token: float | None, cache_idle_slots: bool = True,
                       kv_unified: bool = False, shared_tokens: int | None = None) -> int | None:
    """How many conversations of `prompt_tokens` answered with `answer_tokens` stay warm in a
    round-robin: none when one does not fit a slot's context, the slots when the host cache is off,
    else warm_conversations over the entries `--cache-ram` holds; none of them count when the
    `shared_tokens` a turn has in common with its entry are under RESTORE_MIN_KEEP of it. None when
    the host cache is on but its share cannot be computed (no bytes per token)."""
    if slot_ctx is not None and prompt_tokens + answer_tokens > slot_ctx:
        return 0
    if not cache_ram_mib:
        return slots
    if not bytes_per_token:
        return None
    cells = prompt_tokens + max(answer_tokens - 1, 0)
    entries = prompt_cache_entries(cache_ram_mib, prompt_cache_entry_bytes(cells, bytes_per_token))
    if shared_tokens is not None and shared_tokens < RESTORE_MIN_KEEP * cells:
        entries = 0
    return warm_conversations(slots, entries, cache_idle_slots, kv_unified)
