"""The Metal lines of a llama.cpp boot log (analysis/bootlog.py `metal_device`), on lines as llama.cpp
prints them: older builds' `ggml_metal_init:`, later builds' `ggml_metal_device_init:` (the printf
formats of ggml/src/ggml-metal), and lines pasted in public reports. Expected answers written first:
the working set in MiB is llama.cpp's "MB" (10^6 bytes) over 2^20."""

from __future__ import annotations

import pytest

from loadgen.analysis.bootlog import MetalDevice, boot_facts, metal_device

# The field report's Mac (Apple M1 Max, 64 GB) in a ggml_metal_init build of its time.
FIELD_REPORT = """\
ggml_metal_init: allocating
ggml_metal_init: found device: Apple M1 Max
ggml_metal_init: picking default device: Apple M1 Max
ggml_metal_init: using embedded metal library
ggml_metal_init: GPU name:   Apple M1 Max
ggml_metal_init: GPU family: MTLGPUFamilyApple7  (1007)
ggml_metal_init: GPU family: MTLGPUFamilyCommon3 (3003)
ggml_metal_init: GPU family: MTLGPUFamilyMetal3  (5001)
ggml_metal_init: simdgroup reduction   = true
ggml_metal_init: simdgroup matrix mul. = true
ggml_metal_init: hasUnifiedMemory      = true
ggml_metal_init: recommendedMaxWorkingSetSize  = 55662.79 MB
llama_context: n_ctx         = 32768
llama_kv_cache:      Metal KV buffer size =   640.00 MiB
llama_kv_cache: size =  640.00 MiB ( 32768 cells,  10 layers,  1/1 seqs), K (f16):  320.00 MiB, V (f16):  320.00 MiB
"""
# A later build (ggml_metal_device_init, as 11434's ggml-metal-device.m prints): "GPU name" is the
# backend's MTL0; the chip is in llama's "using device" line.
LATER = """\
ggml_metal_library_init: using embedded metal library
ggml_metal_library_init: loaded in 0.011 sec
ggml_metal_rsets_init: creating a residency set collection (keep_alive = 180 s)
ggml_metal_device_init: GPU name:   MTL0
ggml_metal_device_init: GPU family: MTLGPUFamilyApple9  (1009)
ggml_metal_device_init: GPU family: MTLGPUFamilyCommon3 (3003)
ggml_metal_device_init: GPU family: MTLGPUFamilyMetal4  (5002)
ggml_metal_device_init: simdgroup reduction   = true
ggml_metal_device_init: simdgroup matrix mul. = true
ggml_metal_device_init: has unified memory    = true
ggml_metal_device_init: has bfloat            = true
ggml_metal_device_init: recommendedMaxWorkingSetSize  = 26800.60 MB
llama_model_load_from_file_impl: using device MTL0 (Apple M3 Pro) (unknown id) - 25558 MiB free
"""
# Pasted in llama.cpp issue 5207 (an 8 GB Mac): the allocation lines after it divide by 2^20 (5461.34).
ISSUE_5207 = """\
ggml_metal_init: simdgroup matrix mul. support = true
ggml_metal_init: hasUnifiedMemory              = true
ggml_metal_init: recommendedMaxWorkingSetSize  =  5726.63 MB
ggml_backend_metal_buffer_type_alloc_buffer: allocated buffer, size =   400.00 MiB, ( 5655.70 /  5461.34)\
ggml_backend_metal_log_allocated_size: warning: current allocated size is greater than the recommended max working set size
"""
# Pasted in llama.cpp PR 2011 (2023, M1 Max 32 GB): the first format.
PR_2011 = """\
ggml_metal_init: recommendedMaxWorkingSetSize = 21845.34 MB
ggml_metal_init: hasUnifiedMemory             = true
ggml_metal_init: maxTransferRate              = built-in GPU
"""
# Pasted in llama-cpp-python's issue 948: a build that printed MiB.
IN_MIB = "ggml_metal_init: recommendedMaxWorkingSetSize  = 49152.00 MiB\n"
OLDER_USING = "llama_load_model_from_file: using device Metal (Apple M2 Ultra) - 147456 MiB free\n"
CUDA = """\
ggml_cuda_init: found 1 CUDA devices:
  Device 0: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes
llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 3090) (0000:01:00.0) - 23871 MiB free
llama_kv_cache: size =  256.00 MiB (  4096 cells,  16 layers,  1/1 seqs), K (f16):  128.00 MiB, V (f16):  128.00 MiB
"""


@pytest.mark.parametrize("text,expected", [
    (FIELD_REPORT, MetalDevice(name="Apple M1 Max", gpu_families=("MTLGPUFamilyApple7", "MTLGPUFamilyCommon3",
                                                                 "MTLGPUFamilyMetal3"),
                               unified_memory=True, working_set_mib=53084.17)),
    (LATER, MetalDevice(name="Apple M3 Pro", gpu_families=("MTLGPUFamilyApple9", "MTLGPUFamilyCommon3",
                                                          "MTLGPUFamilyMetal4"),
                        unified_memory=True, working_set_mib=25559.04)),
    (ISSUE_5207, MetalDevice(unified_memory=True, working_set_mib=5461.34)),
    (PR_2011, MetalDevice(unified_memory=True, working_set_mib=20833.34)),
    (IN_MIB, MetalDevice(working_set_mib=49152.0)),
    (OLDER_USING, MetalDevice(name="Apple M2 Ultra")),
    ("ggml_metal_init: hasUnifiedMemory = false\n", MetalDevice(unified_memory=False)),  # an Intel Mac's AMD GPU
    (CUDA, None),
    ("", None),
])
def test_metal_device(text, expected):
    assert metal_device(text) == expected


def test_the_boot_facts_carry_the_metal_device_beside_the_kv_cache():
    facts = boot_facts(FIELD_REPORT)
    assert facts.kv_size_mib == 640.0 and facts.n_ctx == 32768
    assert facts.metal is not None and facts.metal.working_set_mib == 53084.17
    assert facts.to_dict()["metal"] == {"name": "Apple M1 Max", "unified_memory": True, "working_set_mib": 53084.17,
                                        "gpu_families": ["MTLGPUFamilyApple7", "MTLGPUFamilyCommon3",
                                                         "MTLGPUFamilyMetal3"]}
    assert boot_facts(CUDA).to_dict()["metal"] is None


# --- `loadgen kv --boot-log`: the working set shown, and the budget when --memory is not given ------------

@pytest.fixture
def moe(tmp_path):
    from test_kv import QWEN36_MOE, write_gguf
    return write_gguf(tmp_path / "moe.gguf", QWEN36_MOE)


def _log(tmp_path, text: str):
    path = tmp_path / "server.log"
    path.write_text(text)
    return path


def test_kv_on_a_mac_log_takes_the_working_set_as_the_budget(tmp_path, loadgen, moe):
    code, out, err = loadgen("kv", moe, "--ctx", "32768", "--boot-log", _log(tmp_path, FIELD_REPORT))
    assert code == 0, err
    assert "boot log: Metal GPU Apple M1 Max, unified memory (MTLGPUFamilyApple7" in out
    assert "boot log: recommendedMaxWorkingSetSize 53,084.17 MiB" in out
    assert "boot log: llama_kv_cache 640.00 MiB (32,768 cells, 10 layers, 1/1 seqs)" in out
    said = [line for line in out.splitlines() if line.startswith("no --memory")]
    assert said == ["no --memory: the budget is the boot log's Metal working set, 53,084.17 MiB "
                    "(recommendedMaxWorkingSetSize)"]
    assert "memory 53084.17 MiB = 53084.17 MiB for caches:" in out  # the GGUF written here has no weights
    # 640 MiB of KV + 62.81 MiB of recurrent state per 32k slot: 75 fit in 53,084.17 MiB, 76 do not
    assert "32,768 tokens per slot: 75 slot(s)" in out


def test_memory_given_wins_over_the_working_set(tmp_path, loadgen, moe):
    code, out, err = loadgen("kv", moe, "--ctx", "32768", "--memory", "24GiB", "--boot-log", _log(tmp_path, FIELD_REPORT))
    assert code == 0, err
    assert "memory 24576.00 MiB" in out and "no --memory" not in out
    assert "recommendedMaxWorkingSetSize 53,084.17 MiB" in out  # still shown


def test_kv_on_a_cuda_log_has_no_budget(tmp_path, loadgen, moe):
    code, out, err = loadgen("kv", moe, "--ctx", "4096", "--boot-log", _log(tmp_path, CUDA))
    assert code == 0, err
    assert "Metal" not in out and "for caches" not in out
    assert "boot log: llama_kv_cache 256.00 MiB" in out


def test_kv_on_a_log_alone(tmp_path, loadgen):
    import json
    log = _log(tmp_path, LATER)
    code, out, err = loadgen("kv", "--boot-log", log)
    assert code == 0, err
    assert out.splitlines() == [
        "boot log: Metal GPU Apple M3 Pro, unified memory (MTLGPUFamilyApple9, MTLGPUFamilyCommon3, MTLGPUFamilyMetal4)",
        "boot log: recommendedMaxWorkingSetSize 25,559.04 MiB: the most macOS lets the GPU hold (weights, KV cache "
        "and buffers)",
        "boot log: no llama_kv_cache size line (llama-server prints it at -lv 4)"]
    code, out, err = loadgen("kv", "--boot-log", log, "--format", "json")
    assert code == 0 and json.loads(out)["boot_log"]["metal"]["working_set_mib"] == 25559.04


@pytest.mark.parametrize("args,message", [
    ((), "give MODEL.gguf"),
    (("--boot-log", "no-such.log"), "--boot-log no-such.log: No such file or directory"),
])
def test_kv_bad_input(loadgen, args, message):
    code, _, err = loadgen("kv", *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
