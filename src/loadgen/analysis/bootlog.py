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
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

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

    @property
    def kv_size_mib(self) -> float | None:
        """Every KV cache's size added up (a sliding-window model has two); None: not logged (below -lv 4)."""
        return round(sum(c.size_mib for c in self.kv_caches), 2) if self.kv_caches else None

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["kv_caches"] = [asdict(c) for c in self.kv_caches]
        doc["kv_size_mib"] = self.kv_size_mib
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
    return BootFacts(**values)


# Lines llama-server prints as it exits (any exit, a clean stop included): a table of memory use
# that says nothing of why a cell failed, and would fill its log tail.
_EXIT_NOISE = ("llama_memory_breakdown_print",)


def log_tail(text: str, lines: int = 12) -> list[str]:
    """The last `lines` non-blank lines, without the memory table llama-server prints as it exits:
    what a failed start or measurement shows."""
    return [line.rstrip() for line in text.splitlines() if line.strip() and not any(n in line for n in _EXIT_NOISE)
            ][-lines:]
