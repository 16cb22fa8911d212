"""What a llama-server's boot log says about its slots and caches (pure: text in, facts out).

The lines, as llama.cpp prints them (matched with loose whitespace, any log prefix in front):
- default verbosity: `load_model: initializing, n_slots = N, n_ctx_slot = M, kv_unified = 'false'`
- `-lv 4` (the level `loadgen grid` adds): `llama_context: n_seq_max = N`, `n_ctx = N`,
  `n_ctx_seq = N`, `kv_unified = true|false`;
  `llama_kv_cache: size = X MiB (C cells, L layers, S/T seqs), K (f16): X MiB, V (f16): X MiB`;
  `llama_memory_recurrent: size = X MiB (...)`; `common_params_print_info: build N (hash) ...`;
  `srv  init: using N threads for HTTP server` (the HTTP threads: `--threads-http`, or by default
  max(n_parallel + 4, cores − 1) in build 11434, which also adds threads on demand).
A second cache (sliding window) prints its own `llama_kv_cache: size` line: the sizes add up.

A Metal build (Apple GPUs; `metal_device`) says at any verbosity, `ggml_metal_init:` in older builds and
`ggml_metal_device_init:` in later ones (11434): the device (`found device: Apple M1 Max`,
`GPU name:   Apple M1 Max`, where a later build names the backend, `MTL0`, and
`llama_model_load_from_file_impl: using device MTL0 (Apple M1 Max) ...` the chip), its families
(`GPU family: MTLGPUFamilyApple7  (1007)`, Common and Metal likewise), `hasUnifiedMemory = true`
(later `has unified memory    = true`) and `recommendedMaxWorkingSetSize  = 55662.79 MB` (10^6
bytes; one older build printed MiB): the most macOS lets the GPU hold, the budget on a Mac.

The decisions the server takes at boot (`server_boot`, the fingerprint's `boot`; docs/environment.md):
- flash attention: as `--flash-attn auto` resolved it, `resolve_fused_ops: Flash Attention enabled`
  (build 11434) or `... Flash Attention was auto, set to enabled|disabled` (`llama_context:` or
  `sched_reserve:` in other builds), else what was asked, `llama_context: flash_attn = on|off`;
- `--fit` (on by default; `common_params_fit_impl:`, `llama_params_fit_impl:` in older builds):
  `context size reduced from A to B`, a device's `- DEV (name): N layers, ...`, `will leave X >= Y
  MiB of free device memory, no changes needed`, `failed to fit params to free device memory: why`;
- offloaded layers: `load_tensors: offloaded N/M layers to GPU`;
- slots and their context: the `initializing` line above, or a later build's `initializing slots,
  n_slots = N` with `slot load_model: id 0 | task -1 | new slot, n_ctx = M`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.environment import ServerBoot

_INT = {
    "n_seq_max": re.compile(r"llama_context:\s+n_seq_max\s*=\s*(\d+)"),
    "n_ctx": re.compile(r"llama_context:\s+n_ctx\s*=\s*(\d+)"),
    "n_ctx_seq": re.compile(r"llama_context:\s+n_ctx_seq\s*=\s*(\d+)"),
    "n_slots": re.compile(r"n_slots\s*=\s*(\d+)"),
    "n_ctx_slot": re.compile(r"initializing,.*n_ctx_slot\s*=\s*(\d+)"),
    "http_threads": re.compile(r"using\s+(\d+)\s+threads\s+for\s+HTTP\s+server"),
}
_UNIFIED = re.compile(r"kv_unified\s*=\s*'?(true|false)'?")
_KV = re.compile(r"llama_kv_cache:\s+size\s*=\s*([\d.]+)\s*MiB\s*\(\s*(\d+)\s+cells,\s*(\d+)\s+layers,\s*(\d+)\s*/\s*(\d+)"
                 r"\s+seqs\)(?:,\s*K\s*\((\w+)\):\s*[\d.]+\s*MiB,\s*V\s*\((\w+)\))?")
_RECURRENT = re.compile(r"llama_memory_recurrent:\s+size\s*=\s*([\d.]+)\s*MiB")
_BUILD = re.compile(r"\bbuild[:\s]+(\d+\s*\([^)]*\))")
_SLOT_CTX = re.compile(r"new slot,\s*n_ctx\s*=\s*(\d+)")  # a later build's per-slot context
_FLASH_DECIDED = re.compile(r"Flash Attention (?:was \w+, set to )?(enabled|disabled)")
_FLASH_ASKED = re.compile(r"llama_context:\s+flash_attn\s*=\s*(\w+)")
_FLASH_WORDS = {"enabled": True, "on": True, "1": True, "true": True,
                "disabled": False, "off": False, "0": False, "false": False}
_OFFLOADED = re.compile(r"offloaded\s+(\d+)/(\d+)\s+layers\s+to\s+GPU")
_FIT_LINES = (  # (pattern, what the decision is called): each line of --fit that says what it did
    (re.compile(r"params_fit_impl:.*context size reduced from (\d+) to (\d+)"), "context {} → {}"),
    (re.compile(r"params_fit_impl:\s+-\s+(\S+)(?:\s+\([^)]*\))?:\s+(\d+)\s+layers"), "{}: {} layers"),
    (re.compile(r"params_fit_impl:.*(no changes needed)"), "{}"),
    (re.compile(r"(?:fit_params|params_fit):.*failed to fit params to free device memory:\s*(.*?)\s*$"), "not applied: {}"),
)
# llama.cpp's Metal backend (Apple GPUs) at boot: `ggml_metal_init:` in older builds,
# `ggml_metal_device_init:` (and `ggml_metal_library_init:`) in later ones such as 11434.
_METAL_NAME = (re.compile(r"ggml_metal\w*:\s+(?:found device|picking default device):\s*(.+?)\s*$", re.MULTILINE),
               re.compile(r"ggml_metal\w*:\s+GPU name:\s*(.+?)\s*$", re.MULTILINE),
               re.compile(r"using device (?:MTL\d+|Metal)\s+\(([^)]+)\)"))
_METAL_FAMILY = re.compile(r"ggml_metal\w*:\s+GPU family:\s*(MTLGPUFamily\w+)")
_METAL_UNIFIED = re.compile(r"ggml_metal\w*:\s+(?:hasUnifiedMemory|has unified memory)\s*=\s*(true|false)")
_METAL_WORKING_SET = re.compile(r"ggml_metal\w*:\s+recommendedMaxWorkingSetSize\s*=\s*([\d.]+)\s*(MiB|MB)")
_BACKEND_NAME = re.compile(r"^MTL\d+$")  # a later build's "GPU name:" is the backend's name, not the chip's
# Flags of a command line that loadgen chose for the run (a free port) or that change no figure.
_UNCOMPARED_FLAGS = ("--port", "--host")


@dataclass(frozen=True, slots=True)
class KvCacheLine:
    size_mib: float
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str | None
    type_v: str | None


@dataclass(frozen=True, slots=True)
class MetalDevice:
    """The Apple GPU llama.cpp's Metal backend found, as its boot lines say (None: not said)."""

    name: str | None = None  # "Apple M1 Max"
    gpu_families: tuple[str, ...] = ()  # ("MTLGPUFamilyApple7", "MTLGPUFamilyCommon3", "MTLGPUFamilyMetal3")
    unified_memory: bool | None = None  # hasUnifiedMemory / has unified memory
    # recommendedMaxWorkingSetSize in MiB: what macOS lets the GPU hold (llama.cpp prints it in MB, 10^6
    # bytes, "%8.2f MB"; an older build printed MiB): weights, KV cache and buffers must fit under it
    working_set_mib: float | None = None


def metal_device(text: str) -> MetalDevice | None:
    """The Metal device of a boot log; None when the log has no Metal lines (another backend)."""
    names = [m.group(1) for pattern in _METAL_NAME for m in [pattern.search(text)] if m]
    families = tuple(dict.fromkeys(m.group(1) for m in _METAL_FAMILY.finditer(text)))
    unified = _METAL_UNIFIED.search(text)
    working = _METAL_WORKING_SET.search(text)
    if not (names or families or unified or working):
        return None
    working_mib = None
    if working:
        value = float(working.group(1))
        working_mib = round(value if working.group(2) == "MiB" else value * 1e6 / 2**20, 2)
    return MetalDevice(name=next((n for n in names if not _BACKEND_NAME.match(n)), None), gpu_families=families,
                       unified_memory=None if unified is None else unified.group(1) == "true",
                       working_set_mib=working_mib)


@dataclass(frozen=True, slots=True)
class BootFacts:
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    n_seq_max: int | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    kv_unified: bool | None = None
    kv_caches: tuple[KvCacheLine, ...] = field(default_factory=tuple)
    recurrent_mib: float | None = None
    build: str | None = None
    http_threads: int | None = None  # the server's HTTP threads (logged at -lv 4)
    metal: MetalDevice | None = None  # the Apple GPU of a Metal build (None: no Metal lines)

    @property
    def kv_size_mib(self) -> float | None:
        """Every KV cache's size added up (a sliding-window model has two); None: not logged (below -lv 4)."""
        return round(sum(c.size_mib for c in self.kv_caches), 2) if self.kv_caches else None

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["kv_caches"] = [asdict(c) for c in self.kv_caches]
        doc["kv_size_mib"] = self.kv_size_mib
        doc["metal"] = None if self.metal is None else {**asdict(self.metal),
                                                        "gpu_families": list(self.metal.gpu_families)}
        return doc


def boot_facts(text: str) -> BootFacts:
    """The facts of a boot log (absent ones None); only the first occurrence of each counts."""
    values: dict[str, Any] = {}
    for name, pattern in _INT.items():
        m = pattern.search(text)
        values[name] = int(m.group(1)) if m else None
    m = _UNIFIED.search(text)
    values["kv_unified"] = None if m is None else m.group(1) == "true"
    values["kv_caches"] = tuple(
        KvCacheLine(float(k.group(1)), int(k.group(2)), int(k.group(3)), int(k.group(4)), int(k.group(5)),
                    k.group(6), k.group(7)) for k in _KV.finditer(text))
    m = _RECURRENT.search(text)
    values["recurrent_mib"] = float(m.group(1)) if m else None
    m = _BUILD.search(text)
    values["build"] = m.group(1).strip() if m else None
    return BootFacts(**values, metal=metal_device(text))


def flash_attn(text: str) -> bool | None:
    """Whether the server runs with flash attention: as `auto` resolved it, else as asked; None: not said."""
    m = _FLASH_DECIDED.search(text)
    if m:
        return m.group(1) == "enabled"
    m = _FLASH_ASKED.search(text)
    return _FLASH_WORDS.get(m.group(1).lower()) if m else None


def fit_decisions(text: str) -> tuple[str, ...] | None:
    """What `--fit` did, in the log's order ("context 262144 → 4096", "CUDA0: 20 layers", "no changes
    needed", "not applied: n_gpu_layers already set by user to 99, abort"); None: the log says nothing of it."""
    out = []
    for line in text.splitlines():
        for pattern, said in _FIT_LINES:
            m = pattern.search(line)
            if m:
                out.append(said.format(*m.groups()))
                break
    return tuple(out) if out else None


def compared_flags(argv: Sequence[str]) -> tuple[str, ...]:
    """A server's command line as runs compare it: without the program (its build is recorded) and
    without the flags loadgen picks per run (`--port`, `--host`)."""
    out, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg in _UNCOMPARED_FLAGS:
            skip = True
        elif arg.partition("=")[0] not in _UNCOMPARED_FLAGS:
            out.append(arg)
    return tuple(out)


def server_boot(text: str, argv: Sequence[str]) -> ServerBoot:
    """What a server loadgen started decided at boot, from its log and its command line."""
    facts = boot_facts(text)
    m = _SLOT_CTX.search(text)
    offloaded = _OFFLOADED.search(text)
    return ServerBoot(flags=compared_flags(argv), build=facts.build, n_slots=facts.n_slots,
                      n_ctx_slot=facts.n_ctx_slot if facts.n_ctx_slot is not None else (int(m.group(1)) if m else None),
                      kv_unified=facts.kv_unified, flash_attn=flash_attn(text), fit=fit_decisions(text),
                      offloaded_layers=f"{offloaded.group(1)}/{offloaded.group(2)}" if offloaded else None,
                      http_threads=facts.http_threads)


# Lines llama-server prints as it exits (any exit, a clean stop included): a table of memory use
# that says nothing of why a cell failed, and would fill its log tail.
_EXIT_NOISE = ("llama_memory_breakdown_print",)


def log_tail(text: str, lines: int = 12) -> list[str]:
    """The last `lines` non-blank lines, without the memory table llama-server prints as it exits:
    what a failed start or measurement shows."""
    return [line.rstrip() for line in text.splitlines() if line.strip() and not any(n in line for n in _EXIT_NOISE)
            ][-lines:]


# Why a server that exited before it was healthy did (`boot_failure`), most telling first: its own
# words on a flag, on memory, on the model file, on its port, then an assertion; each llama-server's
# line as it prints it (build 11434's, captured from the test bed and llama.cpp's issues).
_BOOT_FAILURES = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"error while handling argument|error: invalid argument|unknown argument",
    r"insufficient memory|out of memory|failed to allocate|unable to allocate|cudaMalloc failed",
    r"error loading model|failed to open GGUF|failed to load model",
    r"couldn't bind|address already in use",
    r"GGML_ASSERT|GGML_ABORT|terminate called|Segmentation fault",
))
_LOG_PREFIX = re.compile(r"^\s*\d+\.\d+\.\d+\.\d+\s+[EWIDT]\s+")  # "0.00.005.230 E " (-lv's timestamps)


def boot_failure(text: str) -> str | None:
    """The line of a server's log that says why it stopped before it was healthy (its timestamp
    left out, cut to 200 characters); None when no line says."""
    lines = [_LOG_PREFIX.sub("", line).strip() for line in text.splitlines() if line.strip()]
    for pattern in _BOOT_FAILURES:
        found = next((line for line in lines if pattern.search(line)), None)
        if found:
            return found[:200]
    errors = [line for line in lines if line.lower().startswith("error")]
    return errors[-1][:200] if errors else None
