"""`loadgen kv MODEL.gguf`: the KV cache and recurrent state llama.cpp will allocate for a model.

With `--boot-log FILE` (a llama-server's log) it also shows what the server said: its KV cache lines
and, from a Metal build (a Mac), the GPU and its working set (`recommendedMaxWorkingSetSize`), which is
the `--memory` budget when none is given (one line says so)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from ..analysis.bootlog import BootFacts, boot_facts
from ..analysis.kv import (
    CACHE_TYPE_BYTES,
    DEFAULT_BATCH,
    FLASH_ATTN,
    MIB,
    ModelShapeError,
    bytes_per_token,
    estimate,
    model_shape,
    slots_that_fit,
)
from ..core.errors import ConfigError
from ..output.kv import boot_log_lines, kv_dict, print_kv
from ..run.gguf_file import read_gguf
from .common import user_errors
from .options import IntList
from .shared import console

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """"24GiB" -> 24 × 2^30 bytes, "24GB" -> 24 × 10^9, "512M" -> 512 × 2^20 (no B: binary, as llama.cpp
    prints), a plain number is bytes."""
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"--memory {text!r} is not a size; write e.g. 24GiB, 512MiB or 24GB")
    number, unit, binary = float(m.group(1)), m.group(2).lower(), m.group(3)
    power = "kmgt".index(unit) + 1 if unit else 0
    decimal = text.strip().lower().endswith("b") and not binary
    return int(number * (1000 if decimal else 1024) ** power)


def read_boot_log(path: str | None) -> BootFacts | None:
    """A server's boot log's facts (KV cache lines, a Metal build's device and working set)."""
    if path is None:
        return None
    try:
        return boot_facts(Path(path).read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise ConfigError(f"--boot-log {path}: {exc.strerror or exc}") from None


def memory_budget(memory: str | None, log: BootFacts | None) -> tuple[int | None, str | None]:
    """(bytes for weights and caches, where they came from): --memory, else a Metal boot log's
    recommendedMaxWorkingSetSize (the most macOS lets the GPU hold), else none."""
    if memory is not None:
        return parse_size(memory), "--memory"
    working = log.metal.working_set_mib if log is not None and log.metal is not None else None
    if working is None:
        return None, None
    return int(working * MIB), "recommendedMaxWorkingSetSize"


@click.command("kv")
@click.argument("model", type=click.Path(dir_okay=False), required=False)
@click.option("--ctx", "-c", "contexts", type=IntList(1, 100_000_000), default="4096,32768,131072",
              show_default=True, help="Context sizes (-c) to size the cache for.")
@click.option("--parallel", "-np", type=click.IntRange(min=1, max=4096), default=1, show_default=True,
              help="Slots (--parallel): sequences that share -c.")
@click.option("--unified/--no-unified", default=False, show_default=True,
              help="One cache shared by every slot (--kv-unified; llama-server's choice when --parallel is not set).")
@click.option("--cache-type-k", "-ctk", "type_k", type=click.Choice(list(CACHE_TYPE_BYTES), case_sensitive=False),
              default="f16", show_default=True, help="K cache type.")
@click.option("--cache-type-v", "-ctv", "type_v", type=click.Choice(list(CACHE_TYPE_BYTES), case_sensitive=False),
              default="f16", show_default=True, help="V cache type.")
@click.option("--ubatch-size", "-ub", "n_ubatch", type=click.IntRange(min=1), default=512, show_default=True,
              help="Physical batch size (sizes the sliding-window cache; capped at -b and -c as llama.cpp does).")
@click.option("--batch-size", "-b", "n_batch", type=click.IntRange(min=1), default=DEFAULT_BATCH, show_default=True,
              help="Logical batch size (caps -ub).")
@click.option("--flash-attn", "-fa", "flash_attn", type=click.Choice(FLASH_ATTN), default="auto", show_default=True,
              help="Flash attention; off stores V transposed, padded to the widest layer, and refuses a quantized V.")
@click.option("--swa-full", is_flag=True, help="A full-size sliding-window cache (llama-server --swa-full).")
@click.option("--memory", help="Memory for weights and caches, e.g. 24GiB: print how many slots of each --ctx "
                               "(per slot) fit.")
@click.option("--boot-log", "boot_log", type=click.Path(dir_okay=False),
              help="A llama-server boot log: show its KV cache lines and, from a Metal build (a Mac), the GPU and "
                   "its working set (recommendedMaxWorkingSetSize), which is the budget when --memory is not given.")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Terminal table, or JSON for scripts.")
def kv_command(model, contexts, parallel, unified, type_k, type_v, n_ubatch, n_batch, flash_attn, swa_full, memory,
               boot_log, output_format) -> None:
    """Print which layers hold KV, bytes per token, and the KV cache and recurrent state llama.cpp allocates."""
    type_k, type_v = type_k.lower(), type_v.lower()
    with user_errors():
        if model is None and boot_log is None:
            raise ConfigError("give MODEL.gguf (the cache it will take), --boot-log FILE (what a server said), or both")
        log = read_boot_log(boot_log)
        budget, budget_from = memory_budget(memory, log)
    if model is None:
        _print_log(log, output_format)
        return
    with user_errors():
        facts = read_gguf(model)
        try:
            shape = model_shape(facts.metadata)
            cache = {"type_k": type_k, "type_v": type_v, "n_ubatch": n_ubatch, "n_batch": n_batch,
                     "flash_attn": flash_attn, "swa_full": swa_full}
            rows = [estimate(shape, c, parallel, unified=unified, **cache) for c in contexts]
            fits = [] if budget is None else [slots_that_fit(shape, budget - facts.weights_bytes, c, **cache)
                                              for c in contexts]
        except ModelShapeError as exc:
            raise ConfigError(f"{model}: {exc}") from None
    per_token = bytes_per_token(shape, type_k, type_v, flash_attn)
    if output_format == "json":
        doc = kv_dict(shape, per_token, rows, cache=cache, fits=fits, budget=(budget or 0) - facts.weights_bytes,
                      weights=facts.weights_bytes, asked=contexts, budget_from=budget_from)
        click.echo(json.dumps(doc | ({"boot_log": log.to_dict()} if log is not None else {}), indent=2))
        return
    print_kv(console(), shape, per_token, rows, type_k=type_k, type_v=type_v, fits=fits,
             budget=(budget or 0) - facts.weights_bytes, weights=facts.weights_bytes, asked=contexts,
             notes=boot_log_lines(log, budget_from) if log is not None else ())


def _print_log(log: BootFacts | None, output_format: str) -> None:
    """`loadgen kv --boot-log FILE` without a model: what the log says."""
    if log is None:
        return
    if output_format == "json":
        click.echo(json.dumps({"boot_log": log.to_dict()}, indent=2))
        return
    out = console()
    for line in boot_log_lines(log, None):
        out.print(line, highlight=False, soft_wrap=True, markup=False)
