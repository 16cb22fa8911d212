"""`loadgen kv` against the real llama-server's boot log, architecture by architecture.

Tiny random-weight models of many architectures (tests/tiny_gguf.py) are booted by the test bed's
llama-server (`-lv 4 -ngl 0 -t 1 --no-warmup -fit off`, a small `-c`), each with a mix of the flags that
change the caches; the figures of its boot log (`llama_kv_cache: size = ...` for the main and the
sliding-window cache, `llama_memory_recurrent: size = ...`, the cells) are written in the table below
and must equal both the log's and `loadgen kv`'s (`analysis.kv.estimate` on the flags as `loadgen grid`
reads them). Every server is stopped by its pid before the test ends.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadgen.analysis import kv
from loadgen.analysis.bootlog import boot_facts
from loadgen.analysis.grid_cells import cache_flags
from loadgen.run.gguf_file import read_gguf
from servers import free_port, terminate, testbed_paths
from tiny_gguf import write_tiny_gguf

pytest.importorskip("gguf", reason="pip install 'loadgen[gguf]' (the dev extra has it)")

pytestmark = pytest.mark.real

READY = ("llama_server: model loaded", "listening on http")
BOOT_TIMEOUT_S = 60
# The line llama-server logs once every cache is made (before a random-weight model's crash).
CACHES_MADE = "sched_reserve"


@dataclass(frozen=True)
class Figures:
    """A boot's caches as llama.cpp prints them: MiB with 2 decimals, cells per stream (None: no such cache)."""

    kv_mib: str | None
    cells: int | None
    swa_mib: str | None = None
    swa_cells: int | None = None
    recurrent_mib: str | None = None


def boot_log(model: Path, flags: tuple[str, ...], log: Path, attempts: int = 3) -> str:
    """Start llama-server on `model` with `flags`, wait until it serves or exits, stop it (by pid); its
    log. Some random-weight models crash during start-up (SIGSEGV after their caches are made: jamba,
    granitehybrid, nemotron_h); the log thread then sometimes dies with the cache lines unwritten (1
    boot in 8 for nemotron_h), so such a boot is tried again, up to `attempts` times."""
    binary, _ = testbed_paths()
    for _ in range(attempts):
        args = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(free_port()), "-lv", "4", "-ngl", "0",
                "-t", "1", "--no-warmup", "-fit", "off", *flags]
        with log.open("wb") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + BOOT_TIMEOUT_S
            while proc.poll() is None and not any(r in log.read_text(errors="replace") for r in READY):
                assert time.monotonic() < deadline, f"llama-server did not finish booting: {log.read_text()[-2000:]}"
                time.sleep(0.05)
        finally:
            terminate(proc, 10)
        assert proc.poll() is not None
        text = log.read_text(errors="replace")
        if any(r in text for r in READY) or CACHES_MADE in text:
            return text
    return text


def logged(text: str, swa: bool) -> Figures:
    """The boot log's figures; with a sliding-window cache its line is the second (llama_kv_cache_iswa)."""
    facts = boot_facts(text)
    caches = list(facts.kv_caches)
    swa_line = caches.pop() if swa and caches else None
    main = caches[0] if caches else None
    return Figures(f"{main.size_mib:.2f}" if main else None, main.cells if main else None,
                   f"{swa_line.size_mib:.2f}" if swa_line else None, swa_line.cells if swa_line else None,
                   f"{facts.recurrent_mib:.2f}" if facts.recurrent_mib is not None else None)


def estimated(model: Path, flags: tuple[str, ...]) -> Figures:
    """loadgen's figures for the same flags, read as `loadgen grid` reads a cell's command."""
    f = cache_flags(["-m", str(model), *flags])
    shape = kv.model_shape(read_gguf(model).metadata)
    est = kv.estimate(shape, f.n_ctx, f.n_parallel, unified=f.unified, type_k=f.type_k, type_v=f.type_v,
                      n_ubatch=f.n_ubatch, n_batch=f.n_batch, flash_attn=f.flash_attn, swa_full=f.swa_full)
    return Figures(kv.mib(est.kv_bytes) if est.layers else None, est.cells if est.layers else None,
                   kv.mib(est.swa_bytes) if est.swa_layers else None, est.swa_cells if est.swa_layers else None,
                   kv.mib(est.recurrent_bytes) if shape.n_recurrent_layers else None)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """model name -> its GGUF, written once per session on first use."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    _, testbed_model = testbed_paths()
    written: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in written:
            written[name] = write_tiny_gguf(folder / f"{name}.gguf", name, testbed_model)
        return written[name]
    return get


C512 = ("-c", "512")
# (model, llama-server flags) -> the boot log's figures (build 11434), which loadgen's must equal.
TABLE: list[tuple[str, tuple[str, ...], Figures]] = [
    ("llama", (*C512, "-np", "2"), Figures("0.25", 256)),
    ("llama", (*C512, "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0"), Figures("0.13", 512)),
    ("phi3", (*C512, "-np", "2"), Figures("0.25", 256)),
    ("phi3", ("-c", "1024", "-np", "2", "-kvu"), Figures("0.50", 1024)),
    ("gpt-oss", (*C512, "-np", "1"), Figures("0.25", 512, swa_mib="0.25", swa_cells=512)),
    ("gpt-oss", ("-c", "1024", "-np", "2", "-kvu"), Figures("0.50", 1024, swa_mib="0.38", swa_cells=768)),
    ("gpt-oss", ("-c", "1024", "-np", "2", "--swa-full"), Figures("0.50", 512, swa_mib="0.50", swa_cells=512)),
    ("gpt-oss", ("-c", "1024", "-np", "1", "-ub", "64", "-b", "128"), Figures("0.50", 1024, swa_mib="0.12", swa_cells=256)),
    ("gpt-oss", ("-c", "1024", "-np", "1", "-fa", "off"), Figures("0.50", 1024, swa_mib="0.38", swa_cells=768)),
    ("llama4", (*C512, "-np", "1"), Figures("0.12", 512, swa_mib="0.38", swa_cells=512)),
    ("llama4", ("-c", "1024", "-np", "2", "-ctk", "q8_0"), Figures("0.19", 512, swa_mib="0.57", swa_cells=512)),
    ("deepseek2", (*C512, "-np", "1"), Figures("0.19", 512)),
    ("deepseek2", (*C512, "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0"), Figures("0.10", 256)),
    ("deepseek2", (*C512, "-np", "1", "-fa", "off"), Figures("0.19", 512)),
    ("qwen35", (*C512, "-np", "4"), Figures("0.25", 256, recurrent_mib="0.23")),
    ("qwen35moe", ("-c", "1024", "-np", "16"), Figures("1.00", 256, recurrent_mib="0.91")),
    ("qwen35moe", (*C512, "-np", "2", "-kvu"), Figures("0.12", 512, recurrent_mib="0.11")),
    ("gemma2", ("-c", "1024", "-np", "1", "-ub", "64", "-b", "64"), Figures("0.50", 1024, swa_mib="0.12", swa_cells=256)),
    ("gemma2", ("-c", "1024", "-np", "2", "--swa-full"), Figures("0.50", 512, swa_mib="0.50", swa_cells=512)),
    ("gemma3", ("-c", "1024", "-np", "1", "-ub", "128"), Figures("0.25", 1024, swa_mib="0.31", swa_cells=256)),
    ("gemma3", ("-c", "1024", "-np", "2", "-kvu", "-ctk", "q8_0", "-ctv", "q8_0"), Figures("0.13", 1024, swa_mib="0.50", swa_cells=768)),
    ("olmo2", ("-c", "1024", "-np", "1", "-ub", "128"), Figures("0.25", 1024, swa_mib="0.19", swa_cells=256)),
    ("falcon-h1", (*C512, "-np", "2"), Figures("0.25", 256, recurrent_mib="0.08")),
    ("lfm2", (*C512, "-np", "3"), Figures("0.38", 256, recurrent_mib="0.01")),
    # a stray ssm.group_count: Mamba-1 reads none
    ("mamba", (*C512, "-np", "2"), Figures(None, None, recurrent_mib="0.07")),
    ("nemotron_h", (*C512, "-np", "2"), Figures("0.25", 256, recurrent_mib="0.08")),
    ("cohere2", ("-c", "1024", "-np", "2", "-ub", "128"), Figures("0.25", 512, swa_mib="0.38", swa_cells=256)),
    ("mamba2", (*C512, "-np", "2"), Figures(None, None, recurrent_mib="0.08")),
    ("qwen3next", (*C512, "-np", "2"), Figures("0.12", 256, recurrent_mib="0.11")),
    # jamba and granitehybrid log their caches, then stop in the graph reserve (random weights)
    ("jamba", (*C512, "-np", "2"), Figures("0.12", 256, recurrent_mib="0.11")),
    ("granitehybrid", (*C512, "-np", "2", "-ctk", "q8_0", "-ctv", "q8_0"), Figures("0.07", 256, recurrent_mib="0.11")),
    ("deci", (*C512, "-np", "1"), Figures("0.44", 512)),
    ("deci", (*C512, "-np", "1", "-fa", "off"), Figures("0.72", 512)),
]


@pytest.mark.parametrize("name, flags, expected", TABLE,
                         ids=[f"{n}{''.join(f for f in flags if f not in C512)}" for n, flags, _ in TABLE])
def test_kv_equals_the_boot_log(tiny_models, tmp_path, name, flags, expected):
    model = tiny_models(name)
    log = boot_log(model, flags, tmp_path / "server.log")
    assert logged(log, expected.swa_mib is not None) == expected, log[-3000:]
    assert estimated(model, flags) == expected


# (model, flags that llama-server refuses) -> the reason in its log, which `loadgen kv` gives in one line.
REFUSED = [
    ("llama", ("-c", "512", "-np", "1", "-ctv", "q8_0", "-fa", "off"), "quantized V cache requires flash_attn"),
    ("deepseek2", ("-c", "512", "-np", "1", "-ctk", "q8_0"), "does not support different K"),
]


@pytest.mark.parametrize("name, flags, reason", REFUSED, ids=[n for n, _, _ in REFUSED])
def test_refused_settings_are_one_line(tiny_models, tmp_path, loadgen, name, flags, reason):
    model = tiny_models(name)
    log = boot_log(model, flags, tmp_path / "server.log")
    assert reason in log and "listening on http" not in log
    f = cache_flags(["-m", str(model), *flags])
    code, out, err = loadgen("kv", model, "--ctx", str(f.n_ctx), "--parallel", str(f.n_parallel), "-ctk", f.type_k,
                             "-ctv", f.type_v, "-fa", f.flash_attn)
    assert code == 2 and reason in err and len(err.strip().splitlines()) == 1, err
    assert "MiB" not in out
