"""Small random-weight LoRA adapters for the test bed's model, in llama.cpp's adapter GGUF format.

llama.cpp's adapter loader (src/llama-adapter.cpp, build 11434) reads a GGUF whose `general.type` is
"adapter", `adapter.type` "lora", `adapter.lora.alpha` a float and `general.architecture` the base
model's; each adapted weight `W` (ggml shape `[n_in, n_out]`, `ne0` first) comes as a pair
`W.lora_a` of shape `[n_in, rank]` and `W.lora_b` of shape `[rank, n_out]`; it refuses a pair whose
outer sizes differ from the base tensor's or whose inner sizes differ from each other. numpy arrays
are written with their axes reversed (ggml's `ne0` is numpy's last axis).

The adapters here touch the query and value projections of every layer; their weights are drawn
small (the product `B·A` scaled by alpha/rank is a perturbation of ~1e-4), so the model's answers
stay sane while the server still applies a separate adapter per request. The shapes come from the
base model's own metadata (read with `gguf.GGUFReader`); nothing from a model hub. Each file is
~2.5 MB at rank 8, written at test time, never committed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TARGETS = ("attn_q", "attn_v")


def base_shapes(model: str, targets: tuple[str, ...] = TARGETS) -> tuple[str, dict[str, tuple[int, int]]]:
    """The base model's architecture and its adapted tensors' ggml shapes `(n_in, n_out)` by name."""
    import gguf

    reader = gguf.GGUFReader(model)
    arch = str(reader.fields["general.architecture"].contents())
    shapes = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and parts[2] in targets and parts[3] == "weight":
            n_in, n_out = (int(n) for n in tensor.shape[:2])
            shapes[tensor.name] = (n_in, n_out)
    return arch, shapes


def write_lora_adapter(path: Path, base_model: str, *, rank: int = 8, alpha: float = 8.0, seed: int = 0,
                       spread: float = 0.01) -> Path:
    """Write a rank-`rank` LoRA adapter for `base_model` (a GGUF) to `path`; weights ~ N(0, spread)."""
    import gguf

    arch, shapes = base_shapes(base_model)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(alpha))
    writer.add_name(f"loadgen-lora-{seed}")
    for name, (n_in, n_out) in shapes.items():
        stem = name.removesuffix(".weight")
        lora_a = rng.normal(0.0, spread, size=(rank, n_in)).astype(np.float32)  # ggml [n_in, rank]
        lora_b = rng.normal(0.0, spread, size=(n_out, rank)).astype(np.float32)  # ggml [rank, n_out]
        writer.add_tensor(f"{stem}.weight.lora_a", lora_a)
        writer.add_tensor(f"{stem}.weight.lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
