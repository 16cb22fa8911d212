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
import msgspec

from ..core.errors import ConfigError
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
    from ..analysis.crossover import crossover
    from ..output.crossover import crossover_lines
    from ..results.crossover import CROSSOVER_FILE, CrossoverQuestion, save_question, spec_sides

    if on_value == off_value:
        raise ConfigError("--on and --off name the same value")
    on, off = spec_sides(Path(grid), param, on_value, off_value)
    found = crossover(on, off, confidence)
    question = CrossoverQuestion(param, on_value, off_value, confidence)
    try:  # for `analyze GRID`, which asks it again of the grid's runs
        save_question(Path(grid), question, found.to_dict())
    except OSError as exc:
        console(stderr=True).print(f"warning: could not write {CROSSOVER_FILE} ({exc})", style="yellow")
    out = console()
    if output_format == "json":
        out.print_json(json.dumps({**msgspec.to_builtins(question), **found.to_dict()}))
        return
    for line in crossover_lines(found):
        out.print(line, highlight=False)
