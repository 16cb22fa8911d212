"""`loadgen kv MODEL.gguf`: the KV cache and recurrent state llama.cpp will allocate for a model."""

from __future__ import annotations

import json
import re

import click

from ..analysis.kv import (
    CACHE_TYPE_BYTES,
    DEFAULT_BATCH,
    FLASH_ATTN,
    ModelShapeError,
    bytes_per_token,
    estimate,
    model_shape,
    slots_that_fit,
)
from ..core.errors import ConfigError
from ..output.kv import kv_dict, print_kv
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


@click.command("kv")
@click.argument("model", type=click.Path(dir_okay=False))
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
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Terminal table, or JSON for scripts.")
def kv_command(model, contexts, parallel, unified, type_k, type_v, n_ubatch, n_batch, flash_attn, swa_full, memory,
               output_format) -> None:
    """Print which layers hold KV, bytes per token, and the KV cache and recurrent state llama.cpp allocates."""
    type_k, type_v = type_k.lower(), type_v.lower()
    with user_errors():
        budget = parse_size(memory) if memory is not None else None
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
        click.echo(json.dumps(kv_dict(shape, per_token, rows, cache=cache, fits=fits,
                                      budget=(budget or 0) - facts.weights_bytes, weights=facts.weights_bytes,
                                      asked=contexts), indent=2))
        return
    print_kv(console(), shape, per_token, rows, type_k=type_k, type_v=type_v, fits=fits,
             budget=(budget or 0) - facts.weights_bytes, weights=facts.weights_bytes, asked=contexts)
