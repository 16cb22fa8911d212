"""The boot decisions of a server loadgen started (analysis/bootlog.py `server_boot`), on lines
llama-server printed, and the drift guard's notes when they differ between two runs."""

from __future__ import annotations

import json
import re

import pytest

from loadgen.analysis.bootlog import compared_flags, server_boot
from loadgen.analysis.env_drift import environment_differences
from machine_tree import build_tree

# Lines of the test bed's boot log (llama-server 11434 on this CPU-only machine, SmolLM2-135M,
# -c 2048 --parallel 2 -lv 4), captured for this test: flash attention resolved from auto, --fit
# with nothing to do, no offload line (no GPU).
BUILD_11434 = """\
0.00.007.620 I cmn  common_param: common_params_print_info: build 0 (unknown) with GNU 12.2.0 for Linux x86_64
0.00.012.084 I srv          init: using 6 threads for HTTP server
0.00.449.268 I common_params_fit_impl: projected to use 152 MiB of host memory vs. 24105 MiB of total host memory
0.00.449.333 I common_params_fit_impl: will leave 23952 >= 1024 MiB of system memory, no changes needed
0.00.449.359 I common_fit_params: successfully fit params to free device memory
0.00.613.627 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB
0.00.615.122 I llama_context: flash_attn            = auto
0.00.615.123 I llama_context: kv_unified            = false
0.00.687.487 I resolve_fused_ops: Flash Attention enabled
0.01.601.697 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, kv_unified = 'false'
0.01.601.724 I slot   load_model: id  0 | task -1 | new slot, n_ctx = 1024
"""
# Lines later builds print (quoted from logs users published), one decision each.
NO_CHANGE = ("0.00.759.587 I common_params_fit_impl: will leave 2086 >= 1024 MiB of free device memory, "
             "no changes needed\n0.00.759.591 I common_fit_params: successfully fit params to free device memory\n")
FITTED_LAYERS = """\
0.00.189.119 I srv          init: using 11 threads for HTTP server
0.00.435.463 I common_params_fit_impl: projected to use 12328 MiB of device memory vs. 7286 MiB of free device memory
0.00.435.468 I common_params_fit_impl: context size set by user to 131072 -> no change
0.01.129.072 I common_params_fit_impl:   - Vulkan0 (NVIDIA GeForce RTX 3060 Ti): 20 layers,   6233 MiB used,   1053 MiB free
0.01.129.076 I common_fit_params: successfully fit params to free device memory
0.01.452.224 I load_tensors: offloaded 20/41 layers to GPU
"""
CONTEXT_CUT = ("common_params_fit_impl: cannot meet free memory target of 12884 MiB, need to reduce device memory "
               "by 10718 MiB\ncommon_params_fit_impl: context size reduced from 262144 to 4096 -> need 9802 MiB less "
               "memory in total\n")
NOT_APPLIED = ("W common_fit_params: failed to fit params to free device memory: llama_params_fit is not implemented "
               "for SPLIT_MODE_TENSOR, abort\n")
FA_RESOLVED_ON = "llama_context: flash_attn    = auto\nsched_reserve: Flash Attention was auto, set to enabled\n"
FA_RESOLVED_OFF = "llama_context: flash_attn    = auto\nllama_context: Flash Attention was auto, set to disabled\n"
FA_ASKED = "llama_context: flash_attn    = enabled\n"
FA_AUTO_ONLY = "llama_context: flash_attn    = auto\n"
LATER_SLOTS = ("0.09.988.810 I srv    load_model: initializing slots, n_slots = 4\n"
               "0.10.252.323 I slot   load_model: id  0 | task -1 | new slot, n_ctx = 2048\n")

# (log, expected (n_slots, n_ctx_slot, flash_attn, fit, offloaded_layers, http_threads)), written before running
CASES = [
    (BUILD_11434, (2, 1024, True, ("no changes needed",), None, 6)),
    (NO_CHANGE, (None, None, None, ("no changes needed",), None, None)),
    (FITTED_LAYERS, (None, None, None, ("Vulkan0: 20 layers",), "20/41", 11)),
    (CONTEXT_CUT, (None, None, None, ("context 262144 → 4096",), None, None)),
    (NOT_APPLIED, (None, None, None, ("not applied: llama_params_fit is not implemented for SPLIT_MODE_TENSOR, abort",),
                   None, None)),
    (FA_RESOLVED_ON, (None, None, True, None, None, None)),
    (FA_RESOLVED_OFF, (None, None, False, None, None, None)),
    (FA_ASKED, (None, None, True, None, None, None)),
    (FA_AUTO_ONLY, (None, None, None, None, None, None)),
    (LATER_SLOTS, (4, 2048, None, None, None, None)),
]


@pytest.mark.parametrize("log,expected", CASES)
def test_boot_decisions_from_real_lines(log, expected):
    b = server_boot(log, ["llama-server"])
    assert (b.n_slots, b.n_ctx_slot, b.flash_attn, b.fit, b.offloaded_layers, b.http_threads) == expected


@pytest.mark.parametrize("argv,expected", [
    (["/opt/llama-server", "-m", "a.gguf", "--port", "41234", "--host", "127.0.0.1", "-lv", "4"],
     ("-m", "a.gguf", "-lv", "4")),
    (["llama-server", "--port=8080", "-c", "4096", "--host=0.0.0.0", "-fa", "on"], ("-c", "4096", "-fa", "on")),
    (["llama-server"], ()),
])
def test_the_flags_compared_leave_out_the_program_and_the_port(argv, expected):
    assert compared_flags(argv) == expected


def _doc(boot: dict) -> dict:
    environment = {"loadgen": "x", "python": "3", "os": "Linux", "kernel": "6.1", "sample": {"at_s": 0.0},
                   "cpu": {"model": "c", "logical_cores": 4}, "memory": {"total_mib": 1, "available_mib": 1,
                                                                       "swap_total_mib": 0, "swap_used_mib": 0},
                   "boot": {"server": boot}}
    return {"kind": "sweep", "targets": [{"label": "server", "levels": []}], "environment": environment}


def test_a_boot_decision_that_differs_is_a_note_never_a_difference():
    base = _doc({"flags": ["-c", "2048"], "n_slots": 2, "flash_attn": True, "fit": ["no changes needed"]})
    cand = _doc({"flags": ["-c", "2048", "-fa", "off"], "n_slots": 2, "flash_attn": False,
                 "fit": ["context 65536 → 4096"]})
    differences, notes = environment_differences([base], [cand])
    assert differences == []
    assert notes == ["server: server flags `-c 2048` in the baseline, `-c 2048 -fa off` in the candidate",
                     "server: server flash attention on in the baseline, off in the candidate",
                     "server: server --fit no changes needed in the baseline, context 65536 → 4096 in the candidate"]
    assert environment_differences([base], [base]) == ([], [])


def test_a_grid_records_each_cells_boot_and_says_where_the_machines_differ(tmp_path):
    """Four cells on one built tree: Gen4 or Gen3 as the server boots (--set-link), and a link that drops
    a generation at the first request of level 2 (--link-drop 6: the warm-up is request 1, level 1 the
    next four). Each run's fingerprint holds its server's flags and boot decisions; the summary says
    which cells' links differ from the first cell's, and which levels changed under load."""
    from servers import GRID_SERVER, grid

    sysfs, procfs = build_tree(tmp_path / "m", gpu_link=(4, 16))
    out = tmp_path / "grid"
    proc = grid("--server", f"{GRID_SERVER} --set-link {sysfs}:{{gen}} --link-drop {{drop}}",
                "--param", "gen=4,3", "--param", "drop=0,6", "--concurrency", "1,2", "--requests", "4",
                "--n-predict", "8", "--warmup", "1", "--sysfs", str(sysfs), "--procfs", str(procfs),
                "--env-interval", "0.02", "--idle-power", "0", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    cells = json.loads((out / "grid.json").read_text())["cells"]
    names = [c["name"] for c in cells]
    assert names == ["gen=4 drop=0", "gen=4 drop=6", "gen=3 drop=0", "gen=3 drop=6"]
    for cell in cells:
        run = json.loads((out / cell["runs"][0]["run_dir"] / "run.json").read_text())
        boot = run["environment"]["boot"]["server"]
        flags = boot["flags"]  # the stand-in's script first: its program is python
        assert flags[flags.index("--set-link") + 1] == f"{sysfs}:{cell['params']['gen']}" and "--port" not in flags
        assert (boot["n_slots"], boot["n_ctx_slot"], boot["flash_attn"]) == (2, 1024, True)
    lines = [re.sub(r" at [\d.]+ s$", "", line) for line in proc.stdout.splitlines() if line.startswith("environment: ")]
    first = "gen=4 drop=0"
    assert lines == [
        f"environment: gen=4 drop=6 against {first}: server PCI 0000:01:00.0: baseline PCIe Gen4 x16; candidate level 2: PCIe Gen3 x16",
        f"environment: gen=3 drop=0 against {first}: server PCI 0000:01:00.0: baseline PCIe Gen4 x16; candidate levels 1, 2: PCIe Gen3 x16",
        f"environment: gen=3 drop=6 against {first}: server PCI 0000:01:00.0: baseline PCIe Gen4 x16; candidate levels 1, 2: PCIe Gen2 x16, Gen3 x16",
        "environment: gen=4 drop=6: the machine changed during server at level 2: PCI 0000:01:00.0: PCIe Gen4 x16 → Gen3 x16",
        "environment: gen=3 drop=6: the machine changed during server at level 2: PCI 0000:01:00.0: PCIe Gen3 x16 → Gen2 x16",
    ], proc.stdout
