"""Terminal rendering of `loadgen kv`: a model's cache layout and its size per configuration."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from ..analysis.kv import KvEstimate, ModelShape, SlotFit, mib


def _ranges(flags: Sequence[bool]) -> str:
    """Layer indices as ranges ("0-29", "3,7,11,...")."""
    picked = [i for i, f in enumerate(flags) if f]
    if not picked:
        return "none"
    if picked == list(range(picked[0], picked[-1] + 1)):
        return f"{picked[0]}-{picked[-1]}" if len(picked) > 1 else str(picked[0])
    shown = ",".join(map(str, picked[:6]))
    return shown + (",..." if len(picked) > 6 else "")


def shape_lines(shape: ModelShape, per_token: int, type_k: str, type_v: str) -> list[str]:
    """What holds KV and how much a token takes."""
    heads = sorted({shape.n_head_kv[i] for i in range(shape.n_layer) if shape.kv_layers[i]})
    lines = [f"{shape.arch}: {shape.n_layer} layers, {shape.n_kv_layers} with KV (layers {_ranges(shape.kv_layers)}), "
             f"KV heads {'/'.join(map(str, heads)) or '-'}, head size K {shape.head_dim_k} V {shape.head_dim_v}, "
             f"trained context {shape.n_ctx_train:,}"]
    if shape.n_swa:
        lines.append(f"sliding window {shape.n_swa:,} in {sum(shape.swa_layers)} layers "
                     f"({_ranges(shape.swa_layers)}): a second, smaller cache")
    if shape.n_recurrent_layers:
        per_seq = shape.n_recurrent_layers * shape.recurrent_elements * 4
        lines.append(f"{shape.n_recurrent_layers} recurrent layers hold no KV; their state is {mib(per_seq)} MiB "
                     "per sequence (f32), whatever the context")
    lines.append(f"K+V per token ({type_k}/{type_v}): {per_token:,} bytes = {per_token / 1024:g} KiB")
    return lines


def kv_table(estimates: Sequence[KvEstimate]) -> Table:
    table = Table(title="KV cache as llama.cpp allocates it", header_style="bold")
    for name in ("-c", "--parallel", "unified", "n_ctx_seq\n(per slot)", "cells × streams", "KV MiB", "K MiB",
                 "V MiB", "SWA MiB", "recurrent MiB", "total MiB"):
        table.add_column(name, justify="left" if name == "unified" else "right")
    for e in estimates:
        table.add_row(f"{e.n_ctx:,}", str(e.n_seq_max), "yes" if e.unified else "no", f"{e.n_ctx_seq:,}",
                      f"{e.cells:,} × {e.n_stream}", mib(e.kv_bytes), mib(e.k_bytes), mib(e.v_bytes),
                      mib(e.swa_bytes) if e.swa_layers else "-",
                      mib(e.recurrent_bytes) if e.recurrent_bytes else "-", mib(e.total_bytes))
    return table


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
             type_k: str, type_v: str, fits: Sequence[SlotFit] = (), budget: int = 0, weights: int = 0) -> None:
    for line in shape_lines(shape, per_token, type_k, type_v):  # the architecture is the file's text: no markup
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    console.print(kv_table(estimates))
    if fits:
        for line in fit_lines(fits, budget, weights):
            console.print(line, highlight=False)
