"""`loadgen crossover GRID --param NAME --on VALUE --off VALUE`: where speculative decoding stops paying.

Thin: the grid's cells are read by results/crossover.py, the verdict is analysis/crossover.py.
The recipe: a `loadgen grid --repeat N` whose template passes one parameter to the server's own
speculation flags (so the flags are the server's, never loadgen's), e.g.

    loadgen grid --server 'llama-server -m M.gguf --parallel 4 --metrics --spec-type {spec}' \\
      --param spec=none,ngram-simple --repeat 3 --concurrency 1,2,4 --n-predict 64
    loadgen crossover GRID --param spec --on ngram-simple --off none
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..analysis.crossover import INCONCLUSIVE, crossover
from ..core.errors import ConfigError
from ..results.crossover import spec_sides
from .help import command
from .shared import console


@command("crossover")
@click.argument("grid", type=click.Path(exists=True, file_okay=False))
@click.option("--param", required=True, help="The grid parameter that turns speculation on and off.")
@click.option("--on", "on_value", required=True, help="Its value with speculation on.")
@click.option("--off", "off_value", required=True, help="Its value with speculation off.")
@click.option("--confidence", type=click.FloatRange(0.5, 0.999), default=0.95, show_default=True,
              help="Confidence of each level's interval.")
@click.option("--format", "output_format", type=click.Choice(["table", "json"]), default="table", show_default=True)
def crossover_command(grid, param, on_value, off_value, confidence, output_format) -> None:
    """Say per concurrency whether speculative decoding pays or costs throughput, from a grid of speculation on
    and off run interleaved and repeated."""
    if on_value == off_value:
        raise ConfigError("--on and --off name the same value")
    on, off = spec_sides(Path(grid), param, on_value, off_value)
    found = crossover(on, off, confidence)
    out = console()
    if output_format == "json":
        out.print_json(json.dumps({"param": param, "on": on_value, "off": off_value, "confidence": confidence,
                                   **found.to_dict()}))
        return
    for e in found.levels:
        note = f" ({e.repeats} paired repeats)" if e.verdict == INCONCLUSIVE else ""
        out.print(f"c={e.level:g}: {e.verdict} {e.text()}{note}", highlight=False)
    out.print(found.sentence, highlight=False)
