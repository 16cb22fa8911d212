"""`loadgen kv`: llama.cpp's KV cache sizing from GGUF metadata, checked against figures logged by
llama-server itself (the field report's `-lv 4` boot logs and the test bed's).

The GGUF files are written here with the `gguf` package's writer: the field report's Qwen3.6 models
are 16-21 GB, but only their metadata decides the cache.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from loadgen.analysis import kv
from loadgen.run.gguf_file import read_gguf

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
