"""`loadgen kv`: llama.cpp's KV cache sizing from GGUF metadata, checked against figures logged by
llama-server itself (the field report's `-lv 4` boot logs and the test bed's).

The GGUF files are written here with the `gguf` package's writer: the field report's Qwen3.6 models
are 16-21 GB, but only their metadata decides the cache.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadgen.analysis import kv
from loadgen.core.errors import ConfigError
from loadgen.run.gguf_file import read_gguf

gguf = pytest.importorskip("gguf", reason="pip install 'loadgen[gguf]' (the dev extra has it)")

MIB = 1024 * 1024

# The field report's two hybrids (3 Gated-DeltaNet layers per attention layer), as their GGUFs say.
QWEN36_MOE = {"arch": "qwen35moe", "block_count": 40, "context_length": 262144, "embedding_length": 2048,
              "attention.head_count": 16, "attention.head_count_kv": 2, "attention.key_length": 256,
              "attention.value_length": 256, "full_attention_interval": 4, "ssm.conv_kernel": 4,
              "ssm.state_size": 128, "ssm.group_count": 16, "ssm.inner_size": 4096, "ssm.time_step_rank": 32}
QWEN36_DENSE = {**QWEN36_MOE, "arch": "qwen35", "block_count": 64, "embedding_length": 5120,
                "attention.head_count": 24, "attention.head_count_kv": 4, "ssm.inner_size": 6144,
                "ssm.time_step_rank": 48}
# The test bed's SmolLM2-135M: no key_length, so head size = 576 / 9.
SMOLLM2 = {"arch": "llama", "block_count": 30, "context_length": 8192, "embedding_length": 576,
           "attention.head_count": 9, "attention.head_count_kv": 3}


def write_gguf(path: Path, spec: dict) -> Path:
    """A metadata-only GGUF (no tensors) with `spec`'s keys under its architecture."""
    arch = spec["arch"]
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in spec.items():
        if key == "arch":
            continue
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        elif isinstance(value, bool):
            writer.add_bool(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def shape_of(tmp_path: Path, spec: dict) -> kv.ModelShape:
    return kv.model_shape(read_gguf(write_gguf(tmp_path / f"{spec['arch']}.gguf", spec)).metadata)


# The field report's table: (model, per-token bytes, {context: MiB at --parallel 1}, recurrent MiB).
FIELD_REPORT = [
    (QWEN36_MOE, 20 * 1024, {4096: "80.00", 32768: "640.00", 131072: "2560.00"}, "62.81"),
    (QWEN36_DENSE, 64 * 1024, {4096: "256.00", 32768: "2048.00", 131072: "8192.00"}, "149.62"),
]


@pytest.mark.parametrize("spec, per_token, cells, recurrent", FIELD_REPORT, ids=["moe-35b-a3b", "dense-27b"])
def test_field_report_kv_table(tmp_path, spec, per_token, cells, recurrent):
    shape = shape_of(tmp_path, spec)
    assert shape.n_kv_layers == spec["block_count"] // 4
    assert shape.kv_layers[3] and not shape.kv_layers[0]  # (i + 1) % 4 == 0 holds attention
    assert kv.bytes_per_token(shape) == per_token
    for n_ctx, expected_mib in cells.items():
        est = kv.estimate(shape, n_ctx, 1)
        assert kv.mib(est.kv_bytes) == expected_mib
        assert kv.mib(est.recurrent_bytes) == recurrent  # constant: whatever the context


def test_testbed_model_at_two_slots(tmp_path):
    """The test bed's boot log: `llama_kv_cache: size = 45.00 MiB (1024 cells, 30 layers, 2/2 seqs),
    K (f16): 22.50 MiB, V (f16): 22.50 MiB` at -c 2048 --parallel 2."""
    est = kv.estimate(shape_of(tmp_path, SMOLLM2), 2048, 2)
    assert (kv.mib(est.kv_bytes), est.cells, est.layers, est.n_stream) == ("45.00", 1024, 30, 2)
    assert (kv.mib(est.k_bytes), kv.mib(est.v_bytes)) == ("22.50", "22.50")


# (-c, --parallel, unified) -> (n_ctx, n_ctx_seq): llama_context pads both to 256, and a split
# context becomes n_ctx_seq × n_seq_max.
CONTEXT_CELLS = [
    ((2048, 2, False), (2048, 1024)),
    ((1000, 1, False), (1024, 1024)),
    ((4096, 3, False), (4608, 1536)),  # 4096 // 3 = 1365 -> 1536 per slot
    ((4096, 4, True), (4096, 4096)),  # unified: every slot sees the whole pool
    ((8192, 4, False), (8192, 2048)),
    ((300, 1, True), (512, 512)),
]


@pytest.mark.parametrize("args, expected", CONTEXT_CELLS)
def test_context_cells(args, expected):
    assert kv.context_cells(*args) == expected


def test_quantised_cache_and_unified(tmp_path):
    shape = shape_of(tmp_path, SMOLLM2)
    q8 = kv.estimate(shape, 2048, 2, type_k="q8_0", type_v="q8_0")
    # 34 bytes per 32 elements instead of 2 bytes each: 22.50 MiB × 17/32
    assert (kv.mib(q8.k_bytes), kv.mib(q8.kv_bytes)) == ("11.95", "23.91")
    q4 = kv.estimate(shape, 2048, 2, type_k="q4_0")
    assert kv.mib(q4.kv_bytes) == "28.83"  # K 22.50 × 9/32 = 6.33 + V 22.50 (f16)
    unified = kv.estimate(shape, 2048, 2, unified=True)
    assert (unified.cells, unified.n_stream, kv.mib(unified.kv_bytes)) == (2048, 1, "45.00")


def test_sliding_window_cache(tmp_path):
    """gemma3's pattern: every 6th layer full attention, the rest a window of pad(n_swa + n_ubatch) cells."""
    spec = {"arch": "gemma3", "block_count": 12, "context_length": 32768, "embedding_length": 1024,
            "attention.head_count": 4, "attention.head_count_kv": 1, "attention.key_length": 256,
            "attention.value_length": 256, "attention.sliding_window": 1024}
    shape = shape_of(tmp_path, spec)
    assert [i for i, s in enumerate(shape.swa_layers) if not s] == [5, 11]
    est = kv.estimate(shape, 8192, 1)
    assert (est.layers, est.swa_layers, est.swa_cells) == (2, 10, 1536)
    assert est.kv_bytes == 2 * 8192 * 256 * 2 * 2  # K + V of the 2 full layers
    assert est.swa_bytes == 10 * 1536 * 256 * 2 * 2


def test_per_layer_heads_mark_recurrent_layers(tmp_path):
    """Hybrids that list KV heads per layer (Jamba, Granite 4): 0 heads is a recurrent layer."""
    spec = {"arch": "granitehybrid", "block_count": 4, "context_length": 4096, "embedding_length": 512,
            "attention.head_count": 8, "attention.head_count_kv": [0, 0, 2, 0], "ssm.conv_kernel": 4,
            "ssm.state_size": 16, "ssm.group_count": 1, "ssm.inner_size": 1024}
    shape = shape_of(tmp_path, spec)
    assert shape.kv_layers == (False, False, True, False)
    assert kv.bytes_per_token(shape) == 2 * 64 * 2 * 2
    est = kv.estimate(shape, 4096, 2)
    assert est.recurrent_bytes == 3 * ((4 - 1) * (1024 + 2 * 16) + 16 * 1024) * 4 * 2


def test_slots_that_fit(tmp_path):
    shape = shape_of(tmp_path, QWEN36_DENSE)
    # 64 KiB/token: a 32k slot's KV is 2048 MiB plus 149.62 MiB of state; 3 of them need 6592.9 MiB.
    fit = kv.slots_that_fit(shape, 7000 * MIB, 32768)
    assert fit.slots == 3
    assert kv.slots_that_fit(shape, 1000 * MIB, 32768).slots == 0


def test_cli_reproduces_the_field_report(tmp_path, loadgen):
    path = write_gguf(tmp_path / "moe.gguf", QWEN36_MOE)
    code, out, err = loadgen("kv", path, "--ctx", "4096,32768,131072")
    assert code == 0, err
    assert "10 with KV" in out and "20 KiB" in out
    for figure in ("80.00", "640.00", "2560.00", "62.81"):
        assert figure in out


@pytest.mark.parametrize("args, message", [
    (("missing.gguf",), "not a readable GGUF"),
    (("{model}", "--memory", "lots"), "not a size"),
])
def test_cli_bad_input(tmp_path, loadgen, args, message):
    model = write_gguf(tmp_path / "m.gguf", SMOLLM2)
    code, _, err = loadgen("kv", *[str(a).format(model=model) for a in args])
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


# --- Every architecture by llama.cpp's own rules (build 11434) -----------------------------------------------
# Small specs whose figures are worked out by hand below from llama.cpp's rules; f16 caches (2 B an element).
# Most have 2 KV heads of 64 and key/value length 64: K 128 + V 128 elements = 512 B per layer and cell.
HEADS = {"embedding_length": 256, "attention.head_count": 4, "attention.head_count_kv": 2,
         "attention.key_length": 64, "attention.value_length": 64, "context_length": 32768}
SSM = {"ssm.conv_kernel": 4, "ssm.state_size": 16, "ssm.group_count": 2, "ssm.inner_size": 256,
       "ssm.time_step_rank": 4}  # R 3 × (256 + 2·2·16) = 960, S 16 × 256 = 4096: 20,224 B a layer and sequence

ARCHS = {
    # a stray window key on llama is not read: the test bed's figure stands
    "llama-stray-window": {**SMOLLM2, "attention.sliding_window": 4096},
    # phi3 switches SWA off whatever its window says: 4 layers × 4 heads × 64
    "phi3-window": {"arch": "phi3", "block_count": 4, "embedding_length": 256, "attention.head_count": 4,
                    "attention.head_count_kv": 4, "context_length": 4096, "attention.sliding_window": 2047},
    # every other layer slides (0, 2), no pattern key
    "gpt-oss": {"arch": "gpt-oss", "block_count": 4, **HEADS, "attention.sliding_window": 128},
    # no window key: 8192-token chunks on 3 of every 4 layers (0-2, 4-6)
    "llama4": {"arch": "llama4", "block_count": 8, **HEADS},
    "llama4-window-0": {"arch": "llama4", "block_count": 8, **HEADS, "attention.sliding_window": 0},
    # MLA: K of kv_lora_rank 64 + 32 RoPE dims = 96, one KV head, no V
    "deepseek2-mla": {"arch": "deepseek2", "block_count": 3, "embedding_length": 512, "attention.head_count": 8,
                      "attention.head_count_kv": 1, "attention.key_length": 96, "attention.value_length": 64,
                      "attention.key_length_mla": 48, "attention.value_length_mla": 32,
                      "attention.kv_lora_rank": 64, "context_length": 4096},
    "deepseek2-mla-mtp": {"arch": "deepseek2", "block_count": 4, "nextn_predict_layers": 1,
                          "embedding_length": 512, "attention.head_count": 8, "attention.head_count_kv": 1,
                          "attention.key_length": 96, "attention.value_length": 64, "attention.key_length_mla": 48,
                          "attention.value_length_mla": 32, "attention.kv_lora_rank": 64, "context_length": 4096},
    "deepseek2-no-mla": {"arch": "deepseek2", "block_count": 3, "embedding_length": 512, "attention.head_count": 8,
                         "attention.head_count_kv": 1, "attention.key_length": 96, "attention.value_length": 64,
                         "context_length": 4096},
    # 8 layers + 1 MTP layer: KV in 3 and 7, state in 0-2 and 4-6; the MTP layer 8 in neither
    "qwen35moe-mtp": {"arch": "qwen35moe", "block_count": 9, "nextn_predict_layers": 1, **HEADS, **SSM,
                      "full_attention_interval": 4},
    # mamba (0 KV heads, 0 FF) in 0 and 3, MLP-only in 1 and 4 (nothing), attention in 2 and 5
    "nemotron_h": {"arch": "nemotron_h", "block_count": 6, **HEADS, **SSM, "ssm.inner_size": 1024,
                   "attention.head_count_kv": [0, 0, 2, 0, 0, 2], "feed_forward_length": [0, 1024, 0, 0, 1024, 0]},
    # KV and a recurrent state in every layer; R 3 × (256 + 2·1·16) = 864, S 4096: 19,840 B
    "falcon-h1": {"arch": "falcon-h1", "block_count": 2, **HEADS, **SSM, "ssm.group_count": 1},
    # short convolution in 0 and 2: R 256 × (3 - 1) = 512 f32 = 2,048 B a layer and sequence
    "lfm2": {"arch": "lfm2", "block_count": 4, **HEADS, "attention.head_count_kv": [0, 2, 0, 2],
             "shortconv.l_cache": 3},
    # with a window, its attention layers (1, 3) slide
    "lfm2-window": {"arch": "lfm2", "block_count": 4, **HEADS, "attention.head_count_kv": [0, 2, 0, 2],
                    "shortconv.l_cache": 3, "attention.sliding_window": 512},
    # no window key: 4096, every other layer (0, 2)
    "gemma2": {"arch": "gemma2", "block_count": 4, **HEADS},
    # per-layer KV heads 2/0/4/1 of 64: K widths 128 + 0 + 256 + 64 = 448 elements, 896 B a cell
    "deci": {"arch": "deci", "block_count": 4, "embedding_length": 256, "attention.head_count": 4,
             "attention.head_count_kv": [2, 0, 4, 1], "context_length": 4096},
    # Mamba-1 reads no group count: a stray one is 0, R 3 × 256 = 768, S 4096: 19,456 B (booted: 0.07 MiB, not 0.08)
    "mamba-stray-groups": {"arch": "mamba", "block_count": 2, "embedding_length": 128, **SSM, "ssm.group_count": 1},
    # RWKV: R 2 × 256 = 512, S 256 × 64 = 16,384: 67,584 B a layer and sequence
    "rwkv6": {"arch": "rwkv6", "block_count": 2, "embedding_length": 256, "wkv.head_size": 64,
              "context_length": 4096},
}

# (spec, -c, -np, flags) -> expected: KV MiB, cells, layers, SWA cells, SWA MiB, recurrent MiB (None: not checked).
ARCH_TABLE = [
    ("llama-stray-window", 2048, 2, {}, ("45.00", 1024, 30, 0, "0.00", "0.00")),
    # 4 × 4096 × (256 + 256) × 2 B = 16 MiB
    ("phi3-window", 4096, 1, {}, ("16.00", 4096, 4, 0, "0.00", "0.00")),
    # 2 × 4096 × 512 = 4 MiB; SWA pad(min(4096, 128 + 512)) = 768 cells: 2 × 768 × 512 = 0.75 MiB
    ("gpt-oss", 4096, 1, {}, ("4.00", 4096, 2, 768, "0.75", "0.00")),
    # -kvu -np 4: pad(min(4096, 128 × 4 + 512)) = 1024 cells: 1 MiB
    ("gpt-oss", 4096, 4, {"unified": True}, ("4.00", 4096, 2, 1024, "1.00", "0.00")),
    # --swa-full: the window cache as big as a slot's context, 2048 cells × 2 streams: 2 × 4096 × 512 = 4 MiB
    ("gpt-oss", 4096, 2, {"swa_full": True}, ("4.00", 2048, 2, 2048, "4.00", "0.00")),
    # 2 × 16384 × 512 = 16 MiB; chunks pad(min(16384, 8192 + 512)) = 8704 cells: 6 × 8704 × 512 = 25.50 MiB
    ("llama4", 16384, 1, {}, ("16.00", 16384, 2, 8704, "25.50", "0.00")),
    ("llama4-window-0", 16384, 1, {}, ("64.00", 16384, 8, 0, "0.00", "0.00")),
    # K only: 3 × 4096 × 96 × 2 B = 2.25 MiB
    ("deepseek2-mla", 4096, 1, {}, ("2.25", 4096, 3, 0, "0.00", "0.00")),
    ("deepseek2-mla-mtp", 4096, 1, {}, ("2.25", 4096, 3, 0, "0.00", "0.00")),
    # without the MLA keys: + V 3 × 4096 × 64 × 2 B = 1.5 MiB
    ("deepseek2-no-mla", 4096, 1, {}, ("3.75", 4096, 3, 0, "0.00", "0.00")),
    # -np 16: 256 cells × 16 streams × 2 layers × 512 = 4 MiB; state 6 × 20,224 × 16 = 1.85 MiB
    ("qwen35moe-mtp", 4096, 16, {}, ("4.00", 256, 2, 0, "0.00", "1.85")),
    # 2 × 4096 × 512 = 4 MiB; state R 3 × (1024 + 64) + S 16 × 1024 = 19,648 f32: 2 × 78,592 B = 0.15 MiB
    ("nemotron_h", 4096, 1, {}, ("4.00", 4096, 2, 0, "0.00", "0.15")),
    # 2048 cells × 2 streams × 2 layers × 512 = 4 MiB; state 2 × 19,840 × 2 = 0.08 MiB
    ("falcon-h1", 4096, 2, {}, ("4.00", 2048, 2, 0, "0.00", "0.08")),
    # -c 16384 -np 64: 256 cells × 64 × 2 × 512 = 16 MiB; state 2 × 2,048 × 64 = 0.25 MiB
    ("lfm2", 16384, 64, {}, ("16.00", 256, 2, 0, "0.00", "0.25")),
    # both attention layers in the window cache: pad(min(4096, 512 + 512)) = 1024 cells × 2 × 512 = 1 MiB
    ("lfm2-window", 4096, 1, {}, ("0.00", 4096, 0, 1024, "1.00", "0.00")),
    # -ub 4096 is capped at -b 2048: pad(min(16384, 4096 + 2048)) = 6144 cells: 2 × 6144 × 512 = 6 MiB
    ("gemma2", 16384, 1, {"n_ubatch": 4096}, ("16.00", 16384, 2, 6144, "6.00", "0.00")),
    # -b 4096 -ub 4096: 8192 cells, 8 MiB
    ("gemma2", 16384, 1, {"n_ubatch": 4096, "n_batch": 4096}, ("16.00", 16384, 2, 8192, "8.00", "0.00")),
    # K 4096 × 896 B = 3.5 MiB, V the same; the 0-head layer is one of the cache's 4 layers
    ("deci", 4096, 1, {}, ("7.00", 4096, 4, 0, "0.00", "0.00")),
    # -fa off: every V row as wide as the widest (256): 4 × 4096 × 512 B = 8 MiB, + K 3.5
    ("deci", 4096, 1, {"flash_attn": "off"}, ("11.50", 4096, 4, 0, "0.00", "0.00")),
    # 2 layers × 19,456 B × 2 sequences = 0.07 MiB
    ("mamba-stray-groups", 512, 2, {}, ("0.00", 256, 0, 0, "0.00", "0.07")),
    # no KV; state 2 × 67,584 × 4 = 0.52 MiB
    ("rwkv6", 4096, 4, {}, ("0.00", 1024, 0, 0, "0.00", "0.52")),
]


ARCH_IDS = [f"{name}-c{n_ctx}-np{parallel}" + "".join(f"-{k}" for k in flags)
            for name, n_ctx, parallel, flags, _ in ARCH_TABLE]


@pytest.mark.parametrize("name, n_ctx, parallel, flags, expected", ARCH_TABLE, ids=ARCH_IDS)
def test_every_architecture_as_llama_cpp_sizes_it(tmp_path, name, n_ctx, parallel, flags, expected):
    shape = shape_of(tmp_path, ARCHS[name])
    est = kv.estimate(shape, n_ctx, parallel, **flags)
    assert (kv.mib(est.kv_bytes), est.cells, est.layers, est.swa_cells, kv.mib(est.swa_bytes),
            kv.mib(est.recurrent_bytes)) == expected


def test_layer_roles(tmp_path):
    """Which layers hold KV, slide and hold state: the rules behind the table."""
    qwen = shape_of(tmp_path, ARCHS["qwen35moe-mtp"])
    assert [i for i, k in enumerate(qwen.kv_layers) if k] == [3, 7]
    assert [i for i, r in enumerate(qwen.recurrent_layers) if r] == [0, 1, 2, 4, 5, 6]  # not the MTP layer 8
    nemotron = shape_of(tmp_path, ARCHS["nemotron_h"])
    assert nemotron.kv_layers == (False, False, True, False, False, True)
    assert nemotron.recurrent_layers == (True, False, False, True, False, False)
    gpt_oss = shape_of(tmp_path, ARCHS["gpt-oss"])
    assert gpt_oss.swa_layers == (True, False, True, False) and gpt_oss.n_swa == 128
    llama4 = shape_of(tmp_path, ARCHS["llama4"])
    assert llama4.chunked and llama4.n_swa == 8192 and not llama4.swa_layers[3] and not llama4.swa_layers[7]
    assert shape_of(tmp_path, ARCHS["phi3-window"]).n_swa == 0
    falcon = shape_of(tmp_path, ARCHS["falcon-h1"])
    assert all(falcon.kv_layers) and all(falcon.recurrent_layers)
    assert shape_of(tmp_path, ARCHS["deepseek2-mla"]).mla


# (spec, cache settings) -> llama.cpp's reason for refusing them (llama_init_from_model)
HEAD_48 = {"arch": "llama", "block_count": 2, "embedding_length": 192, "attention.head_count": 4,
           "context_length": 4096}
REFUSALS = [
    (SMOLLM2, {"type_v": "q8_0", "flash_attn": "off"}, "quantized V cache requires flash_attn to be enabled"),
    (HEAD_48, {"type_k": "q8_0"}, "K cache type q8_0 with block size 32 does not divide n_embd_head_k=48"),
    (HEAD_48, {"type_v": "q4_0", "flash_attn": "on"}, "V cache type q4_0 with block size 32 does not divide "
                                                      "n_embd_head_v=48"),
    (ARCHS["deepseek2-mla"], {"type_k": "q8_0"}, "does not support different K (q8_0) and V (f16) cache types"),
]


@pytest.mark.parametrize("spec, settings, reason", REFUSALS, ids=["quantized-v-fa-off", "q8_0-k-head-48",
                                                                   "q4_0-v-head-48", "mla-k-v-differ"])
def test_settings_llama_cpp_refuses(tmp_path, spec, settings, reason):
    with pytest.raises(kv.SettingsRefused, match=re.escape(reason)):
        kv.estimate(shape_of(tmp_path, spec), 4096, 1, **settings)


def test_allowed_quantized_settings(tmp_path):
    """The same types where llama.cpp takes them: -fa off does not check K's blocks, and MLA with one type."""
    assert kv.estimate(shape_of(tmp_path, HEAD_48), 4096, 1, type_k="q8_0", flash_attn="off").k_bytes > 0
    mla = kv.estimate(shape_of(tmp_path, ARCHS["deepseek2-mla"]), 4096, 1, type_k="q8_0", type_v="q8_0")
    assert mla.k_bytes == 3 * 4096 * 96 * 34 // 32 and mla.v_bytes == 0


def test_mistral4_is_mla_too(tmp_path):
    """mistral4 loads its hyperparameters as deepseek2 does: with the MLA keys, K only."""
    est = kv.estimate(shape_of(tmp_path, {**ARCHS["deepseek2-mla"], "arch": "mistral4"}), 4096, 1)
    assert (kv.mib(est.kv_bytes), kv.mib(est.v_bytes)) == ("2.25", "0.00")


def test_rwkv_without_its_head_size(tmp_path):
    spec = {key: value for key, value in ARCHS["rwkv6"].items() if key != "wkv.head_size"}
    with pytest.raises(kv.ModelShapeError, match="no rwkv6.wkv.head_size"):
        shape_of(tmp_path, spec)


@pytest.mark.parametrize("arch, message", [
    ("no-such-arch", "unknown to this loadgen"),
    ("kimi-linear", "unknown to this loadgen"),
    ("bert", "keeps no KV cache"),
])
def test_architectures_without_a_figure(tmp_path, loadgen, arch, message):
    spec = {**SMOLLM2, "arch": arch, "wkv.head_size": 64}  # RWKV-style metadata under a name loadgen lacks
    code, out, err = loadgen("kv", write_gguf(tmp_path / "m.gguf", spec))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert "MiB" not in out


def test_cli_refused_settings_one_line(tmp_path, loadgen):
    code, out, err = loadgen("kv", write_gguf(tmp_path / "m.gguf", SMOLLM2), "-ctv", "q8_0", "-fa", "off")
    assert code == 2 and "quantized V cache requires flash_attn" in err
    assert len(err.strip().splitlines()) == 1 and "MiB" not in out


def test_block_count_as_a_string(tmp_path, loadgen):
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("llama.block_count", "thirty")
    writer.add_uint32("llama.embedding_length", 576)
    writer.add_uint32("llama.attention.head_count", 9)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, _, err = loadgen("kv", path)
    assert code == 2 and "llama.block_count is 'thirty', not a whole number" in err
    assert len(err.strip().splitlines()) == 1


def test_damaged_files_are_one_line(tmp_path, loadgen):
    """A GGUF cut anywhere: read_gguf says so in one line or reads what is whole, never a traceback (every
    cut point of a file with a tokenizer and tensors); a cut inside the metadata always fails, and the
    command says so in one line (a sample of them)."""
    import numpy as np

    spec = {**SMOLLM2, "attention.head_count_kv": [3] * 30}
    metadata_only = len(write_gguf(tmp_path / "meta.gguf", spec).read_bytes())
    path = tmp_path / "whole.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in spec.items():
        if key != "arch":
            (writer.add_array if isinstance(value, list) else writer.add_uint32)(f"llama.{key}", value)
    writer.add_token_list([f"token{i}" for i in range(16)])
    writer.add_tensor("token_embd.weight", np.zeros((8, 16), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(16, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    whole = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    for end in range(len(whole)):
        cut.write_bytes(whole[:end])
        try:
            kv.model_shape(read_gguf(cut).metadata)
        except (ConfigError, kv.ModelShapeError) as exc:
            assert "\n" not in str(exc), end
        else:
            assert end >= metadata_only - 32, f"a cut at byte {end} of the metadata was read as whole"
    for end in (0, 3, 17, metadata_only // 3, metadata_only // 2, metadata_only - 40):
        cut.write_bytes(whole[:end])
        code, _, err = loadgen("kv", cut)
        assert code == 2 and len(err.strip().splitlines()) == 1, (end, err)


def test_cli_json(tmp_path, loadgen):
    import json
    path = write_gguf(tmp_path / "g.gguf", ARCHS["gpt-oss"])
    code, out, err = loadgen("kv", path, "--ctx", "4096", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["llama_cpp_build"] == kv.LLAMA_CPP_BUILD and doc["swa_layers"] == [0, 2]
    assert (doc["estimates"][0]["kv_mib"], doc["estimates"][0]["swa_mib"], doc["estimates"][0]["swa_cells"]) == (
        4.0, 0.75, 768)


@pytest.mark.parametrize("argv, expected", [
    (["-m", "m.gguf"], (2048, "auto")),
    (["-m", "m.gguf", "-b", "4096", "-fa", "off"], (4096, "off")),
    (["-m", "m.gguf", "--batch-size=512", "--flash-attn", "0"], (512, "off")),
    (["-m", "m.gguf", "-fa", "enabled"], (2048, "on")),
])
def test_grid_reads_batch_and_flash_attention(argv, expected):
    """The grid's estimate for a cell sees -b and -fa as llama-server spells them."""
    from loadgen.analysis.grid_cells import cache_flags
    flags = cache_flags(argv)
    assert (flags.n_batch, kv.flash_mode(flags.flash_attn)) == expected
