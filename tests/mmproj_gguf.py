"""A small random-weight vision projector for the test bed's model, in llama.cpp's clip GGUF format.

llama.cpp's `mtmd` library (build 11434: `llama-server --mmproj FILE`) loads a GGUF whose
`general.architecture` is "clip", with `clip.has_vision_encoder`, `clip.projector_type` and the
`clip.vision.*` hyper-parameters (tools/mtmd/clip-impl.h's keys). The projector here is LLaVA's
`mlp`: a CLIP-style vision transformer (a 16-pixel patch embedding with bias, learned positions,
pre-norm blocks `v.blk.N.{ln1,attn_q,attn_k,attn_v,attn_out,ln2,ffn_up,ffn_down}` with biases, a
final `v.post_ln`) and the two-layer `mm.0` / `mm.2` map to the text model's embedding width (576
for SmolLM2-135M, read from its own metadata). Every image is resized to 64×64 pixels: (64/16)² = 16
image tokens, whatever its size. numpy arrays are written with their axes reversed (ggml's `ne0` is
numpy's last axis).

SmolVLM's own `idefics3` projector (the natural fit: SmolLM2 is SmolVLM-256M's text model) loads
too, but every request with an image then fails with HTTP 400 `Invalid token`: llama-server's
`server_tokens::push_back` refuses a text token of -1, which is what the idefics3 image markers
(`<fake_token_around_image>`, `<global-img>`) become in SmolLM2's vocabulary, which lacks them. The
`mlp` projector adds no markers.

Random weights (a fixed seed) give meaningless answers and real timings and token counts, which is
what a load test needs. ~1 MB, written at test time, never committed; nothing from a model hub.
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


def image_tokens(image_size: int = IMAGE_SIZE, patch: int = PATCH) -> int:
    """How many tokens one image becomes: one a patch."""
    return (image_size // patch) ** 2


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
    """Write an `mlp` projector for `text_model` (a GGUF) to `path`; weights ~ N(0, 0.02)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_name(f"loadgen-mmproj-{seed}")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_uint32("clip.vision.image_size", image_size)
    writer.add_uint32("clip.vision.patch_size", PATCH)
    writer.add_uint32("clip.vision.embedding_length", WIDTH)
    writer.add_uint32("clip.vision.feed_forward_length", FF)
    writer.add_uint32("clip.vision.block_count", BLOCKS)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projection_dim", text_width(text_model))
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
