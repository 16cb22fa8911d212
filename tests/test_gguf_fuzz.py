"""`loadgen kv` against damaged GGUF files: a file cut anywhere, bytes overwritten anywhere (the
header's counts, a string's length, a tensor's dimensions) or metadata of the wrong kind ends as one
line and exit 2, never a traceback (nor a gigabyte tuple from a count of 4 billion layers).

The files are written with the `gguf` package's own writer (the optional extra), then damaged.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servers import run_cli
from test_results_fuzz import FUZZ, assert_clean

SMOLLM2 = {"block_count": 30, "context_length": 8192, "embedding_length": 576, "attention.head_count": 9,
           "attention.head_count_kv": 3}
# GGUF v3's header: magic (4), version (u32), tensor count (u64), metadata count (u64).
TENSOR_COUNT_AT, KV_COUNT_AT = 8, 16


def write_model(path: Path, metadata: dict | None = None) -> Path:
    """A small but complete GGUF (> 1,000 bytes): llama metadata, a string, an array and two tensors."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (metadata or SMOLLM2).items():
        name = f"llama.{key}"
        if isinstance(value, bool):
            writer.add_bool(name, value)
        elif isinstance(value, int) and 0 <= value < 2**32:
            writer.add_uint32(name, value)
        elif isinstance(value, int):
            writer.add_int64(name, max(-2**63, min(value, 2**63 - 1)))
        elif isinstance(value, float):
            writer.add_float32(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        else:
            writer.add_array(name, value)
    writer.add_string("general.name", "fuzz")
    writer.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(40)])
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones((8,), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> bytes:
    return write_model(tmp_path_factory.mktemp("gguf") / "good.gguf").read_bytes()


def kv(tmp_path_factory, data: bytes) -> tuple[int, str, str]:
    path = tmp_path_factory.mktemp("gguf") / "bad.gguf"
    path.write_bytes(data)
    return run_cli("kv", path, "--ctx", "4096", "--memory", "1GiB")


def test_the_undamaged_model_reads(tmp_path_factory, model):
    code, out, err = kv(tmp_path_factory, model)
    assert code == 0, err
    assert "llama: 30 layers" in out


# The field report's crashes, and what each is told (written down before the fix).
DAMAGE = [
    ("cut to 1,000 bytes", lambda b: b[:1000], "not a readable GGUF file"),
    ("cut inside the last weight", lambda b: b[:1420], "not a readable GGUF file"),
    ("cut inside the header", lambda b: b[:12], "not a readable GGUF file"),
    ("empty", lambda b: b"", "not a readable GGUF file"),
    ("tensor count 2^32", lambda b: _put(b, TENSOR_COUNT_AT, 2**32), "not a readable GGUF file"),
    ("tensor count one more", lambda b: _put(b, TENSOR_COUNT_AT, 3), "not a readable GGUF file"),
    ("metadata count 2^63", lambda b: _put(b, KV_COUNT_AT, 2**63), "not a readable GGUF file"),
    ("not a GGUF", lambda b: b"GGML" + b[4:], "not a readable GGUF file"),
]


def _put(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<Q", value) + data[offset + 8:]


@pytest.mark.parametrize("name, damage, message", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_the_field_reports_damage_is_one_line(tmp_path_factory, model, name, damage, message):
    assert len(model) > 1000
    code, _, err = kv(tmp_path_factory, damage(model))
    assert code == 2, err
    assert_clean(code, err)
    assert message in err


def _last_weight_byte(data: bytes, tmp_path_factory) -> int:
    gguf = pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "end.gguf"
    path.write_bytes(data)
    return max(int(t.data_offset) + int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


@FUZZ
@given(cut=st.integers(0, 4096))
def test_a_model_cut_anywhere_is_one_line(tmp_path_factory, model, cut):
    """Cut anywhere before its last weight's last byte, the model is refused (after it, only the
    writer's alignment padding is gone and the model is whole)."""
    cut %= len(model)
    code, _, err = kv(tmp_path_factory, model[:cut])
    assert code == (0 if cut >= _last_weight_byte(model, tmp_path_factory) else 2), err
    assert_clean(code, err)


@FUZZ
@given(at=st.integers(0, 4096), patch=st.binary(min_size=1, max_size=8))
def test_bytes_overwritten_anywhere_are_one_line(tmp_path_factory, model, at, patch):
    at %= len(model)
    code, _, err = kv(tmp_path_factory, model[:at] + patch + model[at + len(patch):])
    assert code in (0, 2), err  # a changed tensor value or name may still be a model
    assert_clean(code, err)


@FUZZ
@given(field=st.sampled_from([TENSOR_COUNT_AT, KV_COUNT_AT]), value=st.integers(0, 2**64 - 1))
def test_any_count_in_the_header_is_one_line(tmp_path_factory, model, field, value):
    code, _, err = kv(tmp_path_factory, _put(model, field, value))
    assert code in (0, 2), err
    assert_clean(code, err)


metadata_values = (st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=True, width=32) | st.booleans()
                   | st.text(max_size=6) | st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40))


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(
    ["block_count", "context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
     "attention.key_length", "attention.sliding_window", "attention.sliding_window_pattern",
     "full_attention_interval", "ssm.conv_kernel", "ssm.state_size", "ssm.inner_size"]),
    metadata_values, min_size=1, max_size=3))
def test_metadata_of_any_kind_is_one_line(tmp_path_factory, changes):
    """A GGUF the reader reads, whose counts are strings, negative, enormous or lists of the wrong length."""
    path = write_model(tmp_path_factory.mktemp("gguf") / "odd.gguf", {**SMOLLM2, **changes})
    code, _, err = run_cli("kv", path, "--ctx", "4096", "--memory", "1GiB")
    assert code in (0, 2), err
    assert_clean(code, err)
