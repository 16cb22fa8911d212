"""How much memory llama.cpp's KV cache and recurrent state take, from a model's GGUF metadata.

Pure functions over the metadata (a dict of GGUF keys: `run.gguf_file` reads it), following
llama.cpp's own sizing (`llama-context.cpp`, `llama-model.cpp`, `llama-kv-cache*.cpp`,
`llama-memory-recurrent.cpp`, `llama-hparams.cpp`):

- Context: `n_ctx` is padded up to a multiple of 256. Without a unified cache each of the
  `n_seq_max` (= `--parallel`) sequences gets its own stream of `n_ctx_seq = pad(n_ctx / n_seq_max, 256)`
  cells; unified, one stream of `n_ctx` cells is shared by all.
- Layers: a layer holds KV unless it is recurrent: hybrids of the Qwen3-Next kind (`qwen3next`,
  `qwen35`, `qwen35moe`) have attention only in every `full_attention_interval`-th layer
  (`(i + 1) % interval == 0`, 4 if the key is absent); hybrids that list per-layer KV heads mark a
  recurrent layer with 0 heads.
- Bytes: per KV layer and cell, K holds `key_length × head_count_kv(layer)` elements and V
  `value_length × head_count_kv(layer)`, at the cache type's size (f16 2 B; q8_0 34 B per 32, ...).
- Sliding-window layers (iSWA) live in a second cache of
  `pad(min(n_ctx_seq, n_swa × (unified ? n_seq_max : 1) + n_ubatch), 256)` cells per stream.
- Recurrent state: per recurrent layer and sequence (`max(1, n_seq_max)` cells), f32 R of
  `(d_conv - 1) × (d_inner + 2 × n_group × d_state)` and S of `d_state × d_inner` elements.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

MIB = 1024 * 1024
PAD = 256  # llama.cpp pads n_ctx, n_ctx_seq and the SWA cache to this many cells
DEFAULT_UBATCH = 512

# Bytes per element of each cache type (ggml's block size / bytes per block).
CACHE_TYPE_BYTES = {
    "f32": Fraction(4), "f16": Fraction(2), "bf16": Fraction(2),
    "q8_0": Fraction(34, 32), "q4_0": Fraction(18, 32), "q4_1": Fraction(20, 32),
    "q5_0": Fraction(22, 32), "q5_1": Fraction(24, 32), "iq4_nl": Fraction(18, 32),
}
# Hybrids whose attention layers are every `full_attention_interval`-th one.
INTERVAL_HYBRIDS = ("qwen3next", "qwen35", "qwen35moe")
DEFAULT_INTERVAL = 4
# Sliding-window layouts that llama.cpp sets in code rather than reading from the GGUF: every
# n-th layer is a full-attention one (`set_swa_pattern(n)`).
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "cohere2": 4}
# Bounds on what the metadata may say: far above any model, low enough that a damaged count (a
# block_count of 4 billion) is refused instead of sizing tuples of it.
MAX_LAYERS = 65_536
MAX_COUNT = 2**40


class ModelShapeError(ValueError):
    """The metadata lacks what the sizing needs; the message names the key."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What llama.cpp's cache sizing reads from a GGUF."""

    arch: str
    n_layer: int
    n_ctx_train: int
    head_dim_k: int  # elements per KV head (`attention.key_length`, else embedding_length / head_count)
    head_dim_v: int
    n_head_kv: tuple[int, ...]  # per layer
    kv_layers: tuple[bool, ...]  # per layer: holds K and V (not recurrent)
    swa_layers: tuple[bool, ...]  # per layer: sliding-window attention
    n_swa: int  # the sliding window, 0 when none
    recurrent_elements: int  # f32 elements of state per recurrent layer and sequence (R + S)
    recurrent_r: int
    recurrent_s: int

    @property
    def n_kv_layers(self) -> int:
        return sum(self.kv_layers)

    @property
    def n_recurrent_layers(self) -> int:
        return self.n_layer - self.n_kv_layers if self.recurrent_elements else 0


@dataclass(frozen=True, slots=True)
class KvEstimate:
    """One configuration's cache, as llama.cpp allocates it (bytes; cells per stream)."""

    n_ctx: int  # after padding (what the boot log's `n_ctx` says)
    n_ctx_seq: int  # per sequence: a slot's context
    n_seq_max: int
    unified: bool
    n_stream: int
    cells: int  # per stream
    layers: int  # full-attention KV layers
    k_bytes: int
    v_bytes: int
    swa_cells: int
    swa_layers: int
    swa_bytes: int
    recurrent_bytes: int

    @property
    def kv_bytes(self) -> int:
        """The main cache: the boot log's `llama_kv_cache: size = ...`."""
        return self.k_bytes + self.v_bytes

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.swa_bytes + self.recurrent_bytes


def _key(meta: dict[str, Any], arch: str, name: str, default: Any = None) -> Any:
    value = meta.get(f"{arch}.{name}", default)
    if value is None:
        raise ModelShapeError(f"the GGUF has no {arch}.{name}")
    return value


def _count(value: Any, name: str, least: int = 0, most: int = MAX_COUNT) -> int:
    """A count the sizing reads, as an int; a value no model has (a string, a negative or absurd
    number: a damaged file's) is a ModelShapeError naming the key."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ModelShapeError(f"{name} is {shown}, not a count from {least} to {most:,}")
    return value


def _counted(meta: dict[str, Any], arch: str, name: str, default: Any = None, least: int = 0,
             most: int = MAX_COUNT) -> int:
    return _count(_key(meta, arch, name, default), f"{arch}.{name}", least, most)


def _per_layer(value: Any, n_layer: int, name: str) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise ModelShapeError(f"{name} lists {len(value)} layers, block_count is {n_layer}")
        return tuple(_count(v, name) for v in value)
    return (_count(value, name),) * n_layer


def _recurrent_layers(meta: dict[str, Any], arch: str, n_head_kv: tuple[int, ...]) -> tuple[bool, ...]:
    """Which layers hold a recurrent state instead of KV."""
    n_layer = len(n_head_kv)
    if arch in INTERVAL_HYBRIDS or f"{arch}.full_attention_interval" in meta:
        interval = _count(meta.get(f"{arch}.full_attention_interval", DEFAULT_INTERVAL),
                          f"{arch}.full_attention_interval", least=1)
        return tuple((i + 1) % interval != 0 for i in range(n_layer))
    if f"{arch}.ssm.state_size" in meta or f"{arch}.ssm.conv_kernel" in meta:
        return tuple(h == 0 for h in n_head_kv)  # per-layer KV heads: 0 marks a recurrent layer
    return (False,) * n_layer


def _swa_layers(meta: dict[str, Any], arch: str, n_layer: int) -> tuple[tuple[bool, ...], int]:
    n_swa = _count(meta.get(f"{arch}.attention.sliding_window", 0) or 0, f"{arch}.attention.sliding_window")
    if not n_swa:
        return (False,) * n_layer, 0
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):
        if len(pattern) < n_layer:
            raise ModelShapeError(f"{arch}.attention.sliding_window_pattern lists {len(pattern)} layers, "
                                  f"block_count is {n_layer}")
        return tuple(bool(p) for p in pattern[:n_layer]), n_swa
    every = _count(pattern, f"{arch}.attention.sliding_window_pattern") if pattern else SWA_PATTERNS.get(arch, 0)
    if not every:  # one window for every layer (mistral-style)
        return (True,) * n_layer, n_swa
    return tuple(i % every < every - 1 for i in range(n_layer)), n_swa


def model_shape(meta: dict[str, Any]) -> ModelShape:
    """The sizing facts of a GGUF's metadata (keys as llama.cpp's `gguf` package names them)."""
    arch = meta.get("general.architecture")
    if not arch:
        raise ModelShapeError("the GGUF has no general.architecture")
    if not isinstance(arch, str):
        raise ModelShapeError(f"general.architecture is {arch!r}, not a name")
    n_layer = _counted(meta, arch, "block_count", least=1, most=MAX_LAYERS)
    n_head = _per_layer(_key(meta, arch, "attention.head_count"), n_layer, "attention.head_count")
    n_head_kv = _per_layer(meta.get(f"{arch}.attention.head_count_kv", n_head), n_layer, "attention.head_count_kv")
    head_dim_k = _count(meta.get(f"{arch}.attention.key_length") or _default_head_dim(meta, arch, n_head),
                        f"{arch}.attention.key_length")
    head_dim_v = _count(meta.get(f"{arch}.attention.value_length") or _default_head_dim(meta, arch, n_head),
                        f"{arch}.attention.value_length")
    recurrent = _recurrent_layers(meta, arch, n_head_kv)
    swa, n_swa = _swa_layers(meta, arch, n_layer)
    r_elements, s_elements = _recurrent_state(meta, arch) if any(recurrent) else (0, 0)
    return ModelShape(
        arch=arch, n_layer=n_layer,
        n_ctx_train=_count(meta.get(f"{arch}.context_length", 0) or 0, f"{arch}.context_length"),
        head_dim_k=head_dim_k, head_dim_v=head_dim_v, n_head_kv=n_head_kv,
        kv_layers=tuple(not r and h > 0 for r, h in zip(recurrent, n_head_kv)),
        swa_layers=swa, n_swa=n_swa, recurrent_elements=r_elements + s_elements,
        recurrent_r=r_elements, recurrent_s=s_elements)


def _default_head_dim(meta: dict[str, Any], arch: str, n_head: tuple[int, ...]) -> int:
    """llama.cpp's default head size when the GGUF gives none: embedding_length / head_count."""
    return _counted(meta, arch, "embedding_length") // (max(n_head) or 1)


def _recurrent_state(meta: dict[str, Any], arch: str) -> tuple[int, int]:
    """f32 elements per recurrent layer and sequence: R (the convolution's state) and S (the SSM's)."""
    d_conv = _counted(meta, arch, "ssm.conv_kernel")
    d_inner = _counted(meta, arch, "ssm.inner_size")
    d_state = _counted(meta, arch, "ssm.state_size")
    n_group = _count(meta.get(f"{arch}.ssm.group_count", 0) or 0, f"{arch}.ssm.group_count")
    r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return r, d_state * d_inner


def pad(n: int, to: int = PAD) -> int:
    return (n + to - 1) // to * to


def context_cells(n_ctx: int, n_seq_max: int, unified: bool) -> tuple[int, int]:
    """(n_ctx, n_ctx_seq) as llama_context computes them: both padded to 256; without a unified
    cache n_ctx becomes n_ctx_seq × n_seq_max (llama.cpp's "rounding down", which may round up)."""
    n_ctx = pad(n_ctx)
    if unified:
        return n_ctx, n_ctx
    n_ctx_seq = pad(n_ctx // n_seq_max)
    if n_ctx_seq == 0:
        raise ModelShapeError(f"a context of {n_ctx} cannot be split among {n_seq_max} sequences")
    return n_ctx_seq * n_seq_max, n_ctx_seq


def cache_type_bytes(cache_type: str) -> Fraction:
    try:
        return CACHE_TYPE_BYTES[cache_type.lower()]
    except KeyError:
        raise ModelShapeError(f"unknown cache type {cache_type!r}; one of {', '.join(CACHE_TYPE_BYTES)}") from None


def _layer_bytes(shape: ModelShape, layers: list[int], cells: int, cache_type: str, head_dim: int) -> int:
    """Bytes of K (or V) over `layers`, `cells` cells each (ggml rows: whole blocks per row)."""
    per_element = cache_type_bytes(cache_type)
    return sum(int(head_dim * shape.n_head_kv[i] * per_element) * cells for i in layers)


def bytes_per_token(shape: ModelShape, type_k: str = "f16", type_v: str = "f16") -> int:
    """K + V bytes one token takes in the full-attention layers (sliding-window ones excluded)."""
    layers = [i for i in range(shape.n_layer) if shape.kv_layers[i] and not shape.swa_layers[i]]
    return _layer_bytes(shape, layers, 1, type_k, shape.head_dim_k) + _layer_bytes(shape, layers, 1, type_v,
                                                                                   shape.head_dim_v)


def estimate(shape: ModelShape, n_ctx: int, n_seq_max: int = 1, *, unified: bool = False, type_k: str = "f16",
             type_v: str = "f16", n_ubatch: int = DEFAULT_UBATCH, swa_full: bool = False) -> KvEstimate:
    """The cache llama.cpp allocates for `-c n_ctx --parallel n_seq_max` (0 context: the model's own)."""
    n_seq_max = max(1, n_seq_max)
    n_ctx, n_ctx_seq = context_cells(n_ctx or shape.n_ctx_train, n_seq_max, unified)
    n_stream = 1 if unified else n_seq_max
    full = [i for i in range(shape.n_layer) if shape.kv_layers[i] and not shape.swa_layers[i]]
    swa = [i for i in range(shape.n_layer) if shape.kv_layers[i] and shape.swa_layers[i]]
    swa_cells = 0
    if swa:
        swa_cells = n_ctx_seq if swa_full else pad(min(n_ctx_seq, shape.n_swa * (n_seq_max if unified else 1)
                                                       + n_ubatch))
    cells = n_ctx_seq * n_stream
    swa_bytes = (_layer_bytes(shape, swa, swa_cells * n_stream, type_k, shape.head_dim_k)
                 + _layer_bytes(shape, swa, swa_cells * n_stream, type_v, shape.head_dim_v))
    return KvEstimate(
        n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_seq_max=n_seq_max, unified=unified, n_stream=n_stream,
        cells=n_ctx_seq, layers=len(full),
        k_bytes=_layer_bytes(shape, full, cells, type_k, shape.head_dim_k),
        v_bytes=_layer_bytes(shape, full, cells, type_v, shape.head_dim_v),
        swa_cells=swa_cells, swa_layers=len(swa), swa_bytes=swa_bytes,
        recurrent_bytes=shape.n_recurrent_layers * shape.recurrent_elements * 4 * n_seq_max)


@dataclass(frozen=True, slots=True)
class SlotFit:
    """The most slots of a given per-slot context whose caches fit a memory budget."""

    ctx_per_slot: int
    slots: int
    estimate: KvEstimate | None  # the cache at that many slots (None: not even one fits)


def slots_that_fit(shape: ModelShape, budget_bytes: int, ctx_per_slot: int, *, max_slots: int = 256,
                   **cache: Any) -> SlotFit:
    """How many slots of `ctx_per_slot` tokens each (`-c ctx×N --parallel N`, not unified) fit in
    `budget_bytes` of KV cache and recurrent state. Memory grows with N, so the first N that does
    not fit ends the search."""
    best: KvEstimate | None = None
    slots = 0
    for n in range(1, max_slots + 1):
        candidate = estimate(shape, ctx_per_slot * n, n, unified=False, **cache)
        if candidate.total_bytes > budget_bytes:
            break
        best, slots = candidate, n
    return SlotFit(ctx_per_slot, slots, best)


def mib(n_bytes: int) -> str:
    """Bytes as llama.cpp prints MiB ("%.2f")."""
    return f"{n_bytes / MIB:.2f}"
