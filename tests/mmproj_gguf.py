"""A small random-weight vision projector for the test bed's model, in llama.cpp's clip GGUF format.

SmolLM2-135M is the text model of SmolVLM-256M, whose vision side llama.cpp's `mtmd` library loads as
an `idefics3` projector: a SigLIP-style vision transformer (patch embedding, learned positions,
pre-norm blocks with biased q/k/v/out projections and a GELU feed-forward, a final norm) followed by
a pixel shuffle by `clip.vision.projector.scale_factor` and one linear map `mm.model.fc.weight` to
the text model's embedding width. The keys and tensor names are llama.cpp's own
(tools/mtmd/clip-impl.h); numpy arrays are written with their axes reversed (ggml's `ne0` is numpy's
last axis).

The encoder here is tiny (64-pixel tiles, 16-pixel patches, 2 blocks, width 64), so an image costs
(64/16)² / scale² tokens a tile and milliseconds to encode: meaningless answers, real timings and
real token counts, which is what a load test needs. Written at test time with a fixed seed, never
committed; nothing from a model hub.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

IMAGE_SIZE = 64
PATCH = 16
WIDTH = 64
FF = 128
HEADS = 2
BLOCKS = 2
SCALE = 2
PROJECTOR = "mlp"


def image_tokens_per_tile(image_size: int = IMAGE_SIZE, patch: int = PATCH, scale: int = SCALE) -> int:
    """How many embeddings one tile becomes after the pixel shuffle."""
    return (image_size // patch) ** 2 // scale ** 2


def _tensors(rng: np.random.Generator, n_text: int, image_size: int) -> dict[str, np.ndarray]:
    def w(*shape: int, spread: float = 0.02) -> np.ndarray:
        return rng.normal(0.0, spread, size=shape).astype(np.float32)

    n_pos = (image_size // PATCH) ** 2
    out = {
        "v.patch_embd.weight": w(WIDTH, 3, PATCH, PATCH),
        "v.patch_embd.bias": np.zeros(WIDTH, np.float32),
        "v.position_embd.weight": w(n_pos, WIDTH),
        "v.post_ln.weight": np.ones(WIDTH, np.float32),
        "v.post_ln.bias": np.zeros(WIDTH, np.float32),
    }
    if PROJECTOR == "idefics3":
        out["mm.model.fc.weight"] = w(n_text, WIDTH * SCALE * SCALE)
    else:
        out["mm.0.weight"] = w(n_text, WIDTH)
        out["mm.0.bias"] = np.zeros(n_text, np.float32)
        out["mm.2.weight"] = w(n_text, n_text)
        out["mm.2.bias"] = np.zeros(n_text, np.float32)
    for i in range(BLOCKS):
        for part in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[f"v.blk.{i}.{part}.weight"] = w(WIDTH, WIDTH)
            out[f"v.blk.{i}.{part}.bias"] = np.zeros(WIDTH, np.float32)
        for norm in ("ln1", "ln2"):
            out[f"v.blk.{i}.{norm}.weight"] = np.ones(WIDTH, np.float32)
            out[f"v.blk.{i}.{norm}.bias"] = np.zeros(WIDTH, np.float32)
        out[f"v.blk.{i}.ffn_up.weight"] = w(FF, WIDTH)
        out[f"v.blk.{i}.ffn_up.bias"] = np.zeros(FF, np.float32)
        out[f"v.blk.{i}.ffn_down.weight"] = w(WIDTH, FF)
        out[f"v.blk.{i}.ffn_down.bias"] = np.zeros(WIDTH, np.float32)
    return out


def text_width(model: str) -> int:
    """The text model's embedding width (the projector's output), from its own metadata."""
    import gguf

    reader = gguf.GGUFReader(model)
    arch = str(reader.fields["general.architecture"].contents())
    return int(reader.fields[f"{arch}.embedding_length"].contents())


def write_mmproj(path: Path, text_model: str, *, image_size: int = IMAGE_SIZE, seed: int = 0) -> Path:
    """Write an idefics3 projector for `text_model` (a GGUF) to `path`; weights ~ N(0, 0.02)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name(f"loadgen-mmproj-{seed}")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", PROJECTOR)
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.preproc_image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FF)
    writer.add_uint32("clip.vision.block_count", BLOCKS)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", text_width(text_model))
    writer.add_uint32("clip.vision.projector.scale_factor", SCALE)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    rng = np.random.default_rng(seed)
    for name, array in _tensors(rng, text_width(text_model), image_size).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
