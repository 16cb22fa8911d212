"""How much memory llama.cpp's KV cache and recurrent state take, from a model's GGUF metadata.

Pure functions over the metadata (a dict of GGUF keys: `run.gguf_file` reads it), following
llama.cpp's own sizing as of build 11434 (`LLAMA_CPP_BUILD`: `llama-context.cpp`, `llama-model.cpp`
and the per-architecture `models/*.cpp`, `llama-kv-cache*.cpp`, `llama-memory-*.cpp`,
`llama-hparams.cpp`):

- Context: `n_ctx` is padded up to a multiple of 256. Without a unified cache each of the
  `n_seq_max` (= `--parallel`) sequences gets its own stream of `n_ctx_seq = pad(n_ctx / n_seq_max, 256)`
  cells; unified, one stream of `n_ctx` cells is shared by all. `-ub` is capped at `-b`, and `-b`
  at `-c`.
- Layers: `block_count` counts the MTP (`nextn_predict_layers`) layers too; the main context's
  caches leave them out. Which of the others hold KV, a recurrent state, or both is a rule of the
  architecture (`ARCH_FAMILIES`): every layer for plain transformers; hybrids mark a recurrent
  layer by 0 KV heads (Jamba, Granite 4, LFM2), by `full_attention_interval` (Qwen3-Next, Qwen3.5),
  by 0 KV heads and 0 feed-forward (Nemotron-H, whose MLP-only layers hold nothing); Falcon-H1
  holds both in every layer; Gemma 3n/4 layers past the first `n_layer_kv_from_start` reuse others'.
- Bytes: per KV layer and cell, K holds `key_length × head_count_kv(layer)` elements and V
  `value_length × head_count_kv(layer)` (`key_length_swa` on sliding-window layers where given),
  at the cache type's size (f16 2 B; q8_0 34 B per 32, ...). With `-fa off` V is stored transposed
  and every layer's V is as wide as the widest. MLA models (DeepSeek-2/3 with `key_length_mla`)
  keep K only: `key_length` is then `kv_lora_rank` + the RoPE dims.
- Sliding-window (and llama4's chunked) layers live in a second cache of
  `pad(min(n_ctx_seq, n_swa × (unified ? n_seq_max : 1) + n_ubatch), 256)` cells per stream
  (`--swa-full`: `n_ctx_seq`). Whether an architecture slides, its window and its pattern are its
  own rule (`SWA_RULES`): gemma2 falls back to 4096, gpt-oss slides every other layer, llama4 chunks
  3 of 4 layers by 8192, phi3 and plain llama ignore a window key.
- Recurrent state: per recurrent layer and sequence (`max(1, n_seq_max)` cells), f32 R and S:
  Mamba-style R `(d_conv - 1) × (d_inner + 2 × n_group × d_state)`, S `d_state × d_inner` (Mamba-1 reads no
  `ssm.group_count`: n_group 0 whatever the file says); RWKV
  R `token_shift_count × n_embd`, S `n_embd × wkv.head_size`; LFM2's short convolution R
  `n_embd × (shortconv.l_cache - 1)`.
- Refusals: settings llama.cpp refuses (`SettingsRefused`, with its reason) and architectures this
  module cannot size (`UnknownArchitecture`) give no figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

LLAMA_CPP_BUILD = 11434  # the llama.cpp source these rules were read from
MIB = 1024 * 1024
PAD = 256  # llama.cpp pads n_ctx, n_ctx_seq and the SWA cache to this many cells
DEFAULT_UBATCH = 512
DEFAULT_BATCH = 2048
FLASH_ATTN = ("auto", "on", "off")  # auto is on wherever the backend has it (every CPU build)
# llama-server's spellings of -fa's values (common/arg.cpp: is_truthy, is_falsey, is_autoy).
FLASH_ATTN_WORDS = {**dict.fromkeys(("on", "enabled", "true", "1"), "on"),
                    **dict.fromkeys(("off", "disabled", "false", "0"), "off"), **dict.fromkeys(("auto", "-1"), "auto")}

# Bytes per element of each cache type (ggml's block size / bytes per block).
CACHE_TYPE_BYTES = {
    "f32": Fraction(4), "f16": Fraction(2), "bf16": Fraction(2),
    "q8_0": Fraction(34, 32), "q4_0": Fraction(18, 32), "q4_1": Fraction(20, 32),
    "q5_0": Fraction(22, 32), "q5_1": Fraction(24, 32), "iq4_nl": Fraction(18, 32),
}
UNQUANTIZED = ("f32", "f16", "bf16")
QUANT_BLOCK = 32  # elements per block of every quantized cache type above

# Every architecture name llama.cpp knows (llama-arch.cpp, build 11434), by how its memory is built.
NO_CACHE = frozenset({  # encoders, embedding and diffusion models: llama.cpp creates no memory
    "bert", "modern-bert", "nomic-bert", "nomic-bert-moe", "neo-bert", "jina-bert-v2", "jina-bert-v3",
    "eurobert", "wavtokenizer-dec", "gemma-embedding", "dream", "llada", "llada-moe", "rnd1", "clef", "clip"})
NOT_SIZED = frozenset({  # caches of their own kind (DSA/MSA indexers, linear attention, shared layers, ...)
    "minimax-m3", "glm-dsa", "deepseek32", "glm5-next", "hy_v4", "dots3note", "deepseek4", "dflash",
    "gemma4-assistant", "qwen4exp", "kimi-linear", "kimi-k3", "bailingmoe3", "minimax-01", "nanbeige",
    "t5", "t5encoder", "graniteswitch", "eagle3", "qwen3tts", "pockettts"})
RWKV = frozenset({"rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
RECURRENT = frozenset({"mamba", "mamba2", *RWKV})
ZERO_HEAD_HYBRIDS = frozenset({"jamba", "plamo2", "granitehybrid", "lfm2", "lfm2moe"})  # 0 KV heads: recurrent
INTERVAL_HYBRIDS = frozenset({"qwen3next", "qwen35", "qwen35moe"})  # every full_attention_interval-th: KV
NEMOTRON_H = frozenset({"nemotron_h", "nemotron_h_moe"})  # 0 KV heads and 0 feed-forward: recurrent
TRANSFORMERS = frozenset({  # every layer holds KV (MTP layers aside)
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan", "starcoder",
    "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl",
    "qwen3vlmoe", "phi2", "phi3", "phimoe", "plamo", "plamo3", "codeshell", "orion", "internlm2", "minicpm",
    "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "starcoder2", "maple", "xverse", "command-r",
    "cohere2", "cohere2moe", "dbrx", "olmo", "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek",
    "deepseek2", "deepseek2-ocr", "chatglm", "glm4", "glm4moe", "bitnet", "jais", "jais2", "nemotron", "exaone",
    "exaone4", "exaone-moe", "granite", "granitemoe", "granite_swa", "chameleon", "plm", "bailingmoe",
    "bailingmoe2", "dots1", "arcee", "afmoe", "laguna", "ernie4_5", "ernie4_5-moe", "hunyuan-moe",
    "hunyuan-dense", "hunyuan_vl", "hy_v3", "smollm3", "gpt-oss", "smallthinker", "seed_oss", "grovemoe",
    "apertus", "hrm_text", "minimax-m2", "cogvlm", "pangu-embedded", "mistral3", "mistral4", "paddleocr",
    "mimo2", "step35", "spark2_5", "llama-embed", "maincoder", "talkie", "mellum"})
ARCH_FAMILIES = {**{a: "none" for a in NO_CACHE}, **{a: "not sized" for a in NOT_SIZED},
                 **{a: "recurrent" for a in RECURRENT}, **{a: "zero-head hybrid" for a in ZERO_HEAD_HYBRIDS},
                 **{a: "interval hybrid" for a in INTERVAL_HYBRIDS}, **{a: "nemotron-h" for a in NEMOTRON_H},
                 "falcon-h1": "falcon-h1", **{a: "transformer" for a in TRANSFORMERS}}
MLA_ARCHS = frozenset({"deepseek2", "mistral4"})  # of the sized ones, those that read key_length_mla
NO_SSM_GROUPS = frozenset({"mamba"})  # Mamba-1: llama.cpp reads no ssm.group_count (a stray one is 0)
KV_FROM_START = {"gemma3n": 20}  # layers past these reuse earlier layers' KV (gemma4: block_count - shared_kv_layers)
DEFAULT_INTERVAL = 4
# Bounds on what the metadata may say: far above any model, low enough that a damaged count (a
# block_count of 4 billion) is refused instead of sizing tuples of it.
MAX_LAYERS = 65_536
MAX_COUNT = 2**40


@dataclass(frozen=True, slots=True)
class SwaRule:
    """How an architecture turns on sliding-window attention (its `load_arch_hparams`)."""

    when: str  # "always"; "window": only with a window key > 0; "64 layers": exaone4's 32B only
    pattern: int | None  # every n-th layer is full attention; None: the GGUF's pattern array is required
    window: int | None = None  # the default window; None: the GGUF's key is required
    dense_first: bool = False  # the full-attention layer opens each group instead of closing it
    forced_window: int | None = None  # a window set in code whatever the key says
    chunked: bool = False  # llama4's chunked attention (sized like SWA)
    attention_layers: bool = False  # every attention layer slides (lfm2: those with KV heads)


SWA_RULES = {
    "gemma2": SwaRule("always", 2, window=4096), "gemma3": SwaRule("window", 6), "gemma3n": SwaRule("always", 5),
    "gemma4": SwaRule("always", None), "cohere2": SwaRule("always", 4),
    "cohere2moe": SwaRule("always", 4, dense_first=True), "gpt-oss": SwaRule("always", 2),
    "exaone-moe": SwaRule("always", 4), "exaone4": SwaRule("64 layers", 4, window=4096),
    "olmo2": SwaRule("window", 4), "plamo3": SwaRule("window", 8), "afmoe": SwaRule("window", 4),
    "mellum": SwaRule("window", 4), "smallthinker": SwaRule("window", 4, dense_first=True, forced_window=4096),
    "laguna": SwaRule("window", 4, dense_first=True), "muse-glimmer": SwaRule("always", 4),
    "llama4": SwaRule("chunked", 4, forced_window=8192, chunked=True),
    "lfm2": SwaRule("window", 0, attention_layers=True),
    "step35": SwaRule("always", None), "granite_swa": SwaRule("always", None), "mimo2": SwaRule("always", None),
    "maple": SwaRule("always", None), "spark2_5": SwaRule("always", None),
}


class ModelShapeError(ValueError):
    """The metadata lacks what the sizing needs, or cannot be sized; the message says why in one sentence."""


class UnknownArchitecture(ModelShapeError):
    """An architecture this loadgen cannot size: no figure rather than a wrong one."""


class SettingsRefused(ModelShapeError):
    """llama.cpp would refuse these settings for this model (its reason in the message)."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What llama.cpp's cache sizing reads from a GGUF, per layer (`block_count` layers, MTP ones included)."""

    arch: str
    n_layer: int  # block_count
    n_layer_nextn: int  # of which MTP layers (the last ones), outside the main context's caches
    n_ctx_train: int
    head_dim_k: tuple[int, ...]  # elements per KV head, per layer
    head_dim_v: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    kv_layers: tuple[bool, ...]  # held by the attention cache (a layer with 0 KV heads may be, at 0 bytes)
    swa_layers: tuple[bool, ...]  # sliding-window (or chunked) attention
    n_swa: int  # the window, 0 when no layer slides
    chunked: bool  # llama4's chunked attention rather than a sliding window
    mla: bool  # K only (multi-head latent attention)
    recurrent_layers: tuple[bool, ...]  # hold a recurrent state
    recurrent_r: int  # f32 elements of state per recurrent layer and sequence
    recurrent_s: int

    @property
    def n_kv_layers(self) -> int:
        return sum(self.kv_layers)

    @property
    def n_recurrent_layers(self) -> int:
        return sum(self.recurrent_layers)

    @property
    def recurrent_elements(self) -> int:
        return self.recurrent_r + self.recurrent_s

    def k_width(self, il: int) -> int:
        """K elements per cell of layer `il`."""
        return self.head_dim_k[il] * self.n_head_kv[il]

    def v_width(self, il: int, transposed: bool = False) -> int:
        """V elements per cell of layer `il`: none with MLA; transposed (-fa off), the widest layer's."""
        if self.mla:
            return 0
        if transposed:
            return max(self.head_dim_v[i] * self.n_head_kv[i] for i in range(self.n_layer))
        return self.head_dim_v[il] * self.n_head_kv[il]


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
    n_ubatch: int = DEFAULT_UBATCH  # after llama.cpp's caps (min of -ub, -b, -c)

    @property
    def kv_bytes(self) -> int:
        """The main cache: the boot log's `llama_kv_cache: size = ...`."""
        return self.k_bytes + self.v_bytes

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.swa_bytes + self.recurrent_bytes


def _whole(value: Any, name: str) -> int:
    """A metadata value as a whole number from 0 to MAX_COUNT, or a one-line ModelShapeError (a
    damaged file's count of billions is refused here, not sized into tuples of it)."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            or int(value) != value or value > MAX_COUNT):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise ModelShapeError(f"{name} is {shown}, not a whole number from 0 to {MAX_COUNT:,}")
    return int(value)


def _key(meta: dict[str, Any], arch: str, name: str, default: Any = None) -> int:
    value = meta.get(f"{arch}.{name}", default)
    if value is None:
        raise ModelShapeError(f"the GGUF has no {arch}.{name}")
    return _whole(value, f"{arch}.{name}")


def _per_layer(value: Any, n_layer: int, name: str) -> tuple[int, ...]:
    """A scalar for every layer, or an array of one per layer (llama.cpp's `get_key_or_arr`)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_layer:
            raise ModelShapeError(f"{name} lists {len(value)} layers, block_count is {n_layer}")
        return tuple(_whole(v, name) for v in value)
    return (_whole(value, name),) * n_layer


def _family(arch: str) -> str:
    family = ARCH_FAMILIES.get(arch)
    if family is None:
        raise UnknownArchitecture(f"architecture {arch!r} is unknown to this loadgen (not one of llama.cpp "
                                  f"build {LLAMA_CPP_BUILD}'s), so no figure is given")
    if family == "not sized":
        raise UnknownArchitecture(f"architecture {arch!r} is unknown to this loadgen's KV sizing (llama.cpp "
                                  f"build {LLAMA_CPP_BUILD} gives it a cache of its own kind), so no figure is given")
    if family == "none":
        raise UnknownArchitecture(f"architecture {arch!r} keeps no KV cache in llama.cpp (an encoder, embedding "
                                  "or diffusion model), so there is nothing to size")
    return family


def _swa(meta: dict[str, Any], arch: str, n_layer: int, n_main: int,
         kv_layers: tuple[bool, ...]) -> tuple[tuple[bool, ...], int]:
    """Which layers slide (or chunk) and the window, per the architecture's rule; the MTP layers never."""
    rule = SWA_RULES.get(arch)
    none = (False,) * n_layer, 0
    if rule is None:
        return none  # the architecture reads no window key: a stray one is ignored
    found = f"{arch}.attention.sliding_window" in meta
    window = _key(meta, arch, "attention.sliding_window", 0) if found else None
    if rule.when == "window" and not window:
        return none
    if rule.when == "chunked" and found and window == 0:
        return none
    if rule.when == "64 layers" and n_main != 64:
        return none
    if rule.forced_window:
        window = rule.forced_window
    elif window is None:
        if rule.window is None:
            raise ModelShapeError(f"the GGUF has no {arch}.attention.sliding_window")
        window = rule.window
    if rule.attention_layers:
        return tuple(kv and i < n_main for i, kv in enumerate(kv_layers)), window
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, (list, tuple)):  # one flag per layer; layers past the list do not slide
        flags = [bool(p) for p in pattern[:n_layer]] + [False] * max(0, n_layer - len(pattern))
        return tuple(f and i < n_main for i, f in enumerate(flags)), window
    if rule.pattern is None:
        raise ModelShapeError(f"the GGUF has no {arch}.attention.sliding_window_pattern array")
    every = rule.pattern if pattern is None else _whole(pattern, f"{arch}.attention.sliding_window_pattern")
    if rule.dense_first:
        slides = [every == 0 or i % every != 0 for i in range(n_layer)]
    else:
        slides = [every == 0 or i % every < every - 1 for i in range(n_layer)]
    layers = tuple(s and i < n_main for i, s in enumerate(slides))
    return (layers, window) if any(layers) else none


def _layers(meta: dict[str, Any], arch: str, family: str, n_layer: int, n_main: int,
            n_head_kv: tuple[int, ...]) -> tuple[tuple[bool, ...], tuple[bool, ...]]:
    """(attention-cache layers, recurrent layers) of the main context, per the family's rule."""
    main = [i < n_main for i in range(n_layer)]
    if family == "recurrent":
        return (False,) * n_layer, tuple(main)
    if family == "falcon-h1":
        return (True,) * n_layer, tuple(main)
    if family == "interval hybrid":
        listed = meta.get(f"{arch}.attention.recurrent_layers")
        if isinstance(listed, (list, tuple)) and len(listed) == n_layer:
            recurrent = [bool(r) for r in listed]
        else:
            interval = _key(meta, arch, "full_attention_interval", DEFAULT_INTERVAL) or DEFAULT_INTERVAL
            recurrent = [main[i] and (i + 1) % interval != 0 for i in range(n_layer)]
        return (tuple(main[i] and not recurrent[i] for i in range(n_layer)),
                tuple(main[i] and recurrent[i] for i in range(n_layer)))
    if family == "zero-head hybrid":
        recurrent = [main[i] and n_head_kv[i] == 0 for i in range(n_layer)]
        return tuple(not r for r in recurrent), tuple(recurrent)
    if family == "nemotron-h":
        n_ff = _per_layer(meta.get(f"{arch}.feed_forward_length", 0), n_layer, f"{arch}.feed_forward_length")
        recurrent = [main[i] and n_head_kv[i] == 0 and n_ff[i] == 0 for i in range(n_layer)]
        return (tuple(not recurrent[i] and n_ff[i] == 0 for i in range(n_layer)),  # MLP-only layers hold nothing
                tuple(recurrent))
    # plain transformers: every layer, but the MTP layers and those that reuse another's KV
    from_start = KV_FROM_START.get(arch, n_layer)
    if arch == "gemma4":
        from_start = n_layer - _key(meta, arch, "attention.shared_kv_layers", 0)
    kv = tuple((main[i] or n_main == 0) and i < from_start for i in range(n_layer))
    return kv, (False,) * n_layer


def _recurrent_state(meta: dict[str, Any], arch: str) -> tuple[int, int]:
    """f32 elements per recurrent layer and sequence: R (convolution / token shift) and S (the SSM's / WKV's)."""
    if arch in RWKV:
        n_embd = _key(meta, arch, "embedding_length")
        shift = _key(meta, arch, "token_shift_count", 2)
        return shift * n_embd, n_embd * _key(meta, arch, "wkv.head_size")
    if arch in ("lfm2", "lfm2moe"):  # a short convolution, no SSM
        return _key(meta, arch, "embedding_length") * (_key(meta, arch, "shortconv.l_cache") - 1), 0
    d_conv = _key(meta, arch, "ssm.conv_kernel")
    d_inner = _key(meta, arch, "ssm.inner_size")
    d_state = _key(meta, arch, "ssm.state_size")
    n_group = 0 if arch in NO_SSM_GROUPS else _key(meta, arch, "ssm.group_count", 0)
    r = (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state)
    return r, d_state * d_inner


def model_shape(meta: dict[str, Any]) -> ModelShape:
    """The sizing facts of a GGUF's metadata (keys as llama.cpp's `gguf` package names them)."""
    arch = meta.get("general.architecture")
    if not arch or not isinstance(arch, str):
        raise ModelShapeError("the GGUF has no general.architecture")
    family = _family(arch)
    n_layer = _key(meta, arch, "block_count")
    if n_layer > MAX_LAYERS:
        raise ModelShapeError(f"{arch}.block_count is {n_layer:,}, more than any model's ({MAX_LAYERS:,})")
    if n_layer == 0:
        raise ModelShapeError(f"{arch}.block_count is 0")
    n_nextn = _key(meta, arch, "nextn_predict_layers", 0)
    if n_nextn > n_layer:
        raise ModelShapeError(f"{arch}.nextn_predict_layers ({n_nextn}) is more than block_count ({n_layer})")
    n_main = n_layer - n_nextn
    n_head = _per_layer(meta.get(f"{arch}.attention.head_count", 0), n_layer, f"{arch}.attention.head_count")
    n_head_kv = _per_layer(meta.get(f"{arch}.attention.head_count_kv", n_head), n_layer,
                           f"{arch}.attention.head_count_kv")
    n_embd = _key(meta, arch, "embedding_length", 0)
    default_head = n_embd // n_head[0] if n_head[0] else 0  # llama.cpp: n_embd / n_head(layer 0)
    head_k = _key(meta, arch, "attention.key_length", default_head)
    head_v = _key(meta, arch, "attention.value_length", default_head)
    head_k_swa = _key(meta, arch, "attention.key_length_swa", head_k)
    head_v_swa = _key(meta, arch, "attention.value_length_swa", head_v)
    kv_layers, recurrent = _layers(meta, arch, family, n_layer, n_main, n_head_kv)
    swa, n_swa = _swa(meta, arch, n_layer, n_main, kv_layers)
    if any(kv_layers) and not n_embd and not meta.get(f"{arch}.attention.key_length"):
        raise ModelShapeError(f"the GGUF has no {arch}.embedding_length")
    r, s = _recurrent_state(meta, arch) if any(recurrent) else (0, 0)
    mla = (arch in MLA_ARCHS and bool(meta.get(f"{arch}.attention.key_length_mla"))
           and bool(meta.get(f"{arch}.attention.value_length_mla")))
    return ModelShape(
        arch=arch, n_layer=n_layer, n_layer_nextn=n_nextn, n_ctx_train=_key(meta, arch, "context_length", 0),
        head_dim_k=tuple(head_k_swa if swa[i] else head_k for i in range(n_layer)),
        head_dim_v=tuple(head_v_swa if swa[i] else head_v for i in range(n_layer)),
        n_head_kv=n_head_kv, kv_layers=kv_layers, swa_layers=swa, n_swa=n_swa,
        chunked=bool(n_swa) and SWA_RULES[arch].chunked, mla=mla, recurrent_layers=recurrent,
        recurrent_r=r, recurrent_s=s)


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


def flash_mode(value: str) -> str:
    """-fa's value as on, off or auto."""
    try:
        return FLASH_ATTN_WORDS[value.lower()]
    except KeyError:
        raise ModelShapeError(f"flash attention {value!r} is not one of {', '.join(FLASH_ATTN)}") from None


def refusal(shape: ModelShape, type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto") -> str | None:
    """llama.cpp's reason for refusing a context with these cache settings (llama_init_from_model), or None."""
    flash_attn = flash_mode(flash_attn)
    cache_type_bytes(type_k), cache_type_bytes(type_v)
    if shape.mla and type_k != type_v:
        return f"model does not support different K ({type_k}) and V ({type_v}) cache types"
    if type_v not in UNQUANTIZED and flash_attn == "off":
        return "quantized V cache requires flash_attn to be enabled"
    main = range(shape.n_layer - shape.n_layer_nextn)
    for which, cache_type, heads in (("K", type_k, shape.head_dim_k), ("V", type_v, shape.head_dim_v)):
        if cache_type in UNQUANTIZED or flash_attn == "off":
            continue
        for il in main:
            if heads[il] % QUANT_BLOCK:
                return (f"{which} cache type {cache_type} with block size {QUANT_BLOCK} does not divide "
                        f"n_embd_head_{which.lower()}={heads[il]}")
    return None


def _cache_bytes(shape: ModelShape, layers: list[int], cells: int, cache_type: str, width) -> int:
    """Bytes of K (or V) over `layers`, `cells` cells each (ggml rows: whole blocks per row)."""
    per_element = cache_type_bytes(cache_type)
    return sum(int(width(i) * per_element) * cells for i in layers)


def bytes_per_token(shape: ModelShape, type_k: str = "f16", type_v: str = "f16", flash_attn: str = "auto") -> int:
    """K + V bytes one token takes in the full-attention layers (sliding-window ones excluded)."""
    layers = [i for i in range(shape.n_layer) if shape.kv_layers[i] and not shape.swa_layers[i]]
    return (_cache_bytes(shape, layers, 1, type_k, shape.k_width)
            + _cache_bytes(shape, layers, 1, type_v, lambda i: shape.v_width(i, flash_mode(flash_attn) == "off")))


def estimate(shape: ModelShape, n_ctx: int, n_seq_max: int = 1, *, unified: bool = False, type_k: str = "f16",
             type_v: str = "f16", n_ubatch: int = DEFAULT_UBATCH, n_batch: int = DEFAULT_BATCH,
             flash_attn: str = "auto", swa_full: bool = False) -> KvEstimate:
    """The cache llama.cpp allocates for `-c n_ctx --parallel n_seq_max` (0 context: the model's own);
    SettingsRefused where llama.cpp would not start with these settings."""
    flash_attn = flash_mode(flash_attn)
    reason = refusal(shape, type_k, type_v, flash_attn)
    if reason:
        raise SettingsRefused(f"llama.cpp refuses these settings for {shape.arch}: {reason}")
    n_seq_max = max(1, n_seq_max)
    n_ctx_asked = n_ctx or shape.n_ctx_train
    n_ubatch = min(n_ubatch, n_batch, n_ctx_asked)  # llama_context: n_batch ≤ n_ctx (causal), n_ubatch ≤ n_batch
    n_ctx, n_ctx_seq = context_cells(n_ctx_asked, n_seq_max, unified)
    n_stream = 1 if unified else n_seq_max
    full = [i for i in range(shape.n_layer) if shape.kv_layers[i] and not shape.swa_layers[i]]
    swa = [i for i in range(shape.n_layer) if shape.kv_layers[i] and shape.swa_layers[i]]
    swa_cells = 0
    if swa:
        swa_cells = n_ctx_seq if swa_full else pad(min(n_ctx_seq, shape.n_swa * (n_seq_max if unified else 1)
                                                       + n_ubatch))

    def v_width(i: int) -> int:
        return shape.v_width(i, transposed=flash_attn == "off")

    swa_bytes = (_cache_bytes(shape, swa, swa_cells * n_stream, type_k, shape.k_width)
                 + _cache_bytes(shape, swa, swa_cells * n_stream, type_v, v_width))
    return KvEstimate(
        n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_seq_max=n_seq_max, unified=unified, n_stream=n_stream,
        cells=n_ctx_seq, layers=len(full),
        k_bytes=_cache_bytes(shape, full, n_ctx_seq * n_stream, type_k, shape.k_width),
        v_bytes=_cache_bytes(shape, full, n_ctx_seq * n_stream, type_v, v_width),
        swa_cells=swa_cells, swa_layers=len(swa), swa_bytes=swa_bytes,
        recurrent_bytes=shape.n_recurrent_layers * shape.recurrent_elements * 4 * n_seq_max, n_ubatch=n_ubatch)


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


INFEASIBLE = "infeasible"  # a grid cell dropped before its server started (`does_not_fit`)


def does_not_fit(weights_mib: float | None, cache_mib: float | None, memory_mib: float,
                 budget_name: str = "--memory") -> str | None:
    """Why a server whose weights and KV cache (and recurrent state) alone exceed `memory_mib` cannot
    run, in one line; None when they fit or a figure is unknown (then nothing is claimed). Weights plus
    caches is a lower bound of what the server allocates (compute buffers come on top), so a cell
    dropped by it could never have fit; one that passes may still run out of memory as it boots."""
    if weights_mib is None or cache_mib is None:
        return None
    need = weights_mib + cache_mib
    if need <= memory_mib:
        return None
    return (f"needs at least {need:,.0f} MiB (weights {weights_mib:,.0f} + KV cache {cache_mib:,.0f}), more than "
            f"{budget_name} {memory_mib:,.0f} MiB: not started")
