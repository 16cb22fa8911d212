"""Terminal rendering of `loadgen kv`: a model's cache layout and its size per configuration."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console

from ..analysis.bootlog import BootFacts
from ..analysis.kv import LLAMA_CPP_BUILD, MIB, KvEstimate, ModelShape, SlotFit, mib
from .layout import Column, Grid, print_table


def _ranges(flags: Sequence[bool]) -> str:
    """Layer indices as ranges ("0-29", "3,7,11,...")."""
    picked = [i for i, f in enumerate(flags) if f]
    if not picked:
        return "none"
    if picked == list(range(picked[0], picked[-1] + 1)):
        return f"{picked[0]}-{picked[-1]}" if len(picked) > 1 else str(picked[0])
    shown = ",".join(map(str, picked[:6]))
    return shown + (",..." if len(picked) > 6 else "")


def _sizes(values: Sequence[int]) -> str:
    return "/".join(map(str, sorted(set(values)))) or "-"


def shape_lines(shape: ModelShape, per_token: int, type_k: str, type_v: str) -> list[str]:
    """What holds KV and how much a token takes."""
    kv = [i for i in range(shape.n_layer) if shape.kv_layers[i]]
    heads = "K only (MLA), head size K " + _sizes([shape.head_dim_k[i] for i in kv]) if shape.mla else (
        f"head size K {_sizes([shape.head_dim_k[i] for i in kv])} V {_sizes([shape.head_dim_v[i] for i in kv])}")
    lines = [f"{shape.arch}: {shape.n_layer} layers, {shape.n_kv_layers} with KV (layers {_ranges(shape.kv_layers)}), "
             f"KV heads {_sizes([shape.n_head_kv[i] for i in kv])}, {heads}, trained context {shape.n_ctx_train:,}"]
    if shape.n_layer_nextn:
        lines.append(f"{shape.n_layer_nextn} MTP layer(s) at the end: outside the main context's caches")
    if shape.n_swa:
        kind = "chunked attention" if shape.chunked else "sliding window"
        lines.append(f"{kind} {shape.n_swa:,} in {sum(shape.swa_layers)} layers "
                     f"({_ranges(shape.swa_layers)}): a second, smaller cache")
    if shape.n_recurrent_layers:
        per_seq = shape.n_recurrent_layers * shape.recurrent_elements * 4
        held = "also hold KV" if any(k and r for k, r in zip(shape.kv_layers, shape.recurrent_layers)) else "hold no KV"
        lines.append(f"{shape.n_recurrent_layers} recurrent layers ({_ranges(shape.recurrent_layers)}) {held}; their "
                     f"state is {mib(per_seq)} MiB per sequence (f32), whatever the context")
    lines.append(f"K+V per token ({type_k}/{type_v}): {per_token:,} bytes = {per_token / 1024:g} KiB")
    return lines


def kv_table(estimates: Sequence[KvEstimate], asked: Sequence[int] | None = None) -> Grid:
    """One row per configuration: the -c given (`asked`, in the estimates' order) beside the n_ctx
    llama.cpp pads it to, then the cache. A layout Grid, so no figure is cut at any width."""
    asked = list(asked) if asked is not None else [e.n_ctx for e in estimates]
    grid = Grid("KV cache as llama.cpp allocates it", [
        Column("-c", key=True), Column("n_ctx\n(padded)"), Column("--parallel"), Column("unified", "left"),
        Column("n_ctx_seq\n(per slot)"), Column("cells ×\nstreams"), Column("KV MiB"), Column("K MiB"),
        Column("V MiB"), Column("SWA MiB"), Column("recurrent\nMiB"), Column("total MiB")])
    for c, e in zip(asked, estimates):
        grid.add_row(f"{c:,}", f"{e.n_ctx:,}", str(e.n_seq_max), "yes" if e.unified else "no", f"{e.n_ctx_seq:,}",
                     f"{e.cells:,} × {e.n_stream}", mib(e.kv_bytes), mib(e.k_bytes), mib(e.v_bytes),
                     mib(e.swa_bytes) if e.swa_layers else "-",
                     mib(e.recurrent_bytes) if e.recurrent_bytes else "-", mib(e.total_bytes))
    return grid


def beyond_trained(shape: ModelShape, estimates: Sequence[KvEstimate], asked: Sequence[int]) -> str | None:
    """The note on every -c whose per-slot context (n_ctx_seq) exceeds the model's trained one, or None."""
    beyond = list(dict.fromkeys(c for c, e in zip(asked, estimates)
                                if shape.n_ctx_train and e.n_ctx_seq > shape.n_ctx_train))
    if not beyond:
        return None
    named = ", ".join(f"{c:,}" for c in beyond[:-1]) + (" and " if len(beyond) > 1 else "") + f"{beyond[-1]:,}"
    return (f"note: -c {named} {'are' if len(beyond) > 1 else 'is'} beyond the model's trained context "
            f"({shape.n_ctx_train:,}) per slot: llama-server allows it with a warning, and the output past the "
            "trained length is only as good as the model's RoPE scaling")


def fit_lines(fits: Sequence[SlotFit], budget: int, weights: int) -> list[str]:
    head = f"memory {mib(budget + weights)} MiB" + (f" - weights {mib(weights)} MiB" if weights else "")
    lines = [f"{head} = {mib(budget)} MiB for caches:"]
    for fit in fits:
        if fit.estimate is None:
            lines.append(f"  {fit.ctx_per_slot:,} tokens per slot: not even one slot fits")
        else:
            lines.append(f"  {fit.ctx_per_slot:,} tokens per slot: {fit.slots} slot(s) "
                         f"(-c {fit.estimate.n_ctx} --parallel {fit.slots}: {mib(fit.estimate.total_bytes)} MiB)")
    return lines


def print_kv(console: Console, shape: ModelShape, per_token: int, estimates: Sequence[KvEstimate], *,
             type_k: str, type_v: str, fits: Sequence[SlotFit] = (), budget: int = 0, weights: int = 0,
             asked: Sequence[int] | None = None, notes: Sequence[str] = ()) -> None:
    """The layout, the table, then `notes` (a boot log's lines) and what fits the budget."""
    for line in shape_lines(shape, per_token, type_k, type_v):  # the architecture is the file's text: no markup
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    asked = list(asked) if asked is not None else [e.n_ctx for e in estimates]
    print_table(console, kv_table(estimates, asked))
    note = beyond_trained(shape, estimates, asked)
    if note:
        console.print(note, style="yellow", highlight=False, soft_wrap=True, markup=False)
    for line in notes:
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if fits:
        for line in fit_lines(fits, budget, weights):
            console.print(line, highlight=False)


def boot_log_lines(log: BootFacts, budget_from: str | None) -> list[str]:
    """What a boot log says of the cache and, from a Metal build, of the Apple GPU and its working set;
    `budget_from` "recommendedMaxWorkingSetSize" when that working set is the budget (no --memory)."""
    lines = []
    metal = log.metal
    if metal is not None:
        said = [metal.name or "unnamed device", *(["unified memory"] if metal.unified_memory else [])]
        families = f" ({', '.join(metal.gpu_families)})" if metal.gpu_families else ""
        lines.append(f"boot log: Metal GPU {', '.join(said)}{families}")
        if metal.working_set_mib is not None:
            lines.append(f"boot log: recommendedMaxWorkingSetSize {metal.working_set_mib:,.2f} MiB: the most macOS "
                         f"lets the GPU hold (weights, KV cache and buffers)")
    for cache in log.kv_caches:
        lines.append(f"boot log: llama_kv_cache {cache.size_mib:.2f} MiB ({cache.cells:,} cells, {cache.layers} layers, "
                     f"{cache.seqs}/{cache.streams} seqs)")
    if log.recurrent_mib is not None:
        lines.append(f"boot log: recurrent state {log.recurrent_mib:.2f} MiB")
    if not log.kv_caches and log.recurrent_mib is None:
        lines.append("boot log: no llama_kv_cache size line (llama-server prints it at -lv 4)")
    if budget_from == "recommendedMaxWorkingSetSize" and metal is not None and metal.working_set_mib is not None:
        lines.append(f"no --memory: the budget is the boot log's Metal working set, {metal.working_set_mib:,.2f} MiB "
                     f"(recommendedMaxWorkingSetSize)")
    return lines


def _indices(flags: Sequence[bool]) -> list[int]:
    return [i for i, f in enumerate(flags) if f]


def _mib(n_bytes: int) -> float:
    return round(n_bytes / MIB, 2)


def kv_dict(shape: ModelShape, per_token: int, estimates: Sequence[KvEstimate], *, cache: dict[str, Any],
            fits: Sequence[SlotFit] = (), budget: int = 0, weights: int = 0,
            asked: Sequence[int] | None = None, budget_from: str | None = None) -> dict[str, Any]:
    """`loadgen kv --format json`: the layout and one entry per configuration, MiB as llama.cpp rounds
    them; `ctx` is the -c given (`asked`), `n_ctx` what llama.cpp pads it to."""
    asked = list(asked) if asked is not None else [e.n_ctx for e in estimates]
    out: dict[str, Any] = {
        "llama_cpp_build": LLAMA_CPP_BUILD, "arch": shape.arch, "layers": shape.n_layer,
        "mtp_layers": shape.n_layer_nextn, "kv_layers": _indices(shape.kv_layers),
        "swa_layers": _indices(shape.swa_layers), "n_swa": shape.n_swa, "chunked": shape.chunked, "mla": shape.mla,
        "recurrent_layers": _indices(shape.recurrent_layers), "n_ctx_train": shape.n_ctx_train,
        "bytes_per_token": per_token, "cache": cache,
        "estimates": [{"ctx": c, "n_ctx": e.n_ctx, "beyond_trained": bool(shape.n_ctx_train)
                       and e.n_ctx_seq > shape.n_ctx_train, "n_ctx_seq": e.n_ctx_seq, "n_seq_max": e.n_seq_max, "unified": e.unified,
                       "n_stream": e.n_stream, "n_ubatch": e.n_ubatch, "cells": e.cells, "layers": e.layers,
                       "kv_mib": _mib(e.kv_bytes), "k_mib": _mib(e.k_bytes), "v_mib": _mib(e.v_bytes),
                       "swa_cells": e.swa_cells, "swa_layers": e.swa_layers, "swa_mib": _mib(e.swa_bytes),
                       "recurrent_mib": _mib(e.recurrent_bytes), "total_mib": _mib(e.total_bytes)}
                      for c, e in zip(asked, estimates)]}
    if fits:
        out["memory"] = {"budget_mib": _mib(budget), "weights_mib": _mib(weights),
                         **({"budget_from": budget_from} if budget_from is not None else {}),
                         "fits": [{"ctx_per_slot": f.ctx_per_slot, "slots": f.slots,
                                   "total_mib": _mib(f.estimate.total_bytes) if f.estimate else None} for f in fits]}
    return out
