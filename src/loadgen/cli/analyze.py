"""`loadgen analyze RESULTS_DIR`: reprint a saved run's tables and verdicts, no server needed.

Reads through results/ only, so it loads neither the engine nor an HTTP client.
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from ..core.errors import ConfigError, UserError
from ..core.rundoc import RunDocument
from ..output.cache import cache_capacity_table, kept_records
from ..output.layout import print_table
from ..results.reader import load_probe, load_records, load_run
from ..results.schema import CACHE_CAPACITY_FILE
from .options import PERCENTILES
from .shared import console as _console
from .shared import format_option


def check_all_records(doc: RunDocument, option: str) -> None:
    """ConfigError (one sentence) unless the run kept every request's record (--records all)."""
    config = doc.config
    kept = config.records if config is not None else "all"
    if kept != "all":
        raise ConfigError(f"{option} needs every request's record and this run kept {kept} (--records {kept}); "
                          "rerun the sweep with it")


@click.command()
@click.argument("results_dir", type=click.Path(file_okay=False))
@click.option("--knee-gain", type=click.FloatRange(min=0), help="Override the run's saturation rule (throughput share).")
@click.option("--knee-latency", type=click.FloatRange(min=0), help="Override the run's saturation rule (latency share).")
@click.option("--percentiles", type=PERCENTILES, default=None,
              help="Show these percentiles of TTFT, latency, TPOT and ITL per level (e.g. 50,95,99.9), "
                   "computed from the run's records, instead of the fixed p50/p99/max.")
@format_option
def analyze(results_dir, knee_gain, knee_latency, output_format, percentiles=None) -> None:
    """Reprint a saved run's tables and saturation verdicts, or a grid's summary (no server needed)."""
    from ..output.grid_table import print_grid
    from ..output.tables import print_run
    from ..results.grid_file import grid_summaries, is_grid, load_grid, one_run_in_grid, read_cache_capacity
    from ..results.reread import reanalyse

    path = Path(results_dir)
    if is_grid(path):
        if output_format != "table":
            raise ConfigError(f"--format {output_format} is for a run; a grid's figures are in its grid.json")
        grid = load_grid(path)
        print_grid(_console(), grid, grid_summaries(path, grid))
        _crossover_again(path)
        return
    path = one_run_in_grid(path)  # a grid's cell named by id or name: its one run (or the runs to choose from)
    # a cache-capacity run (or a grid's cell run of one, GRID/cells/c01/r1): its per-K table
    capacity_dir = next((d for d in (path, path / "run") if (d / CACHE_CAPACITY_FILE).is_file()), None)
    if capacity_dir is not None:
        print_table(_console(), cache_capacity_table(read_cache_capacity(capacity_dir)))
        return
    doc = load_run(path)
    if not doc.kind.has_levels:  # a table per target (its kind's view)
        print_run(doc, _console(), _console(stderr=True), output_format)
        if output_format in ("table", "markdown"):
            _kind_answer(path, doc, _console())
        return
    records, samples = load_records(path), load_probe(path)
    if percentiles:
        check_all_records(doc, "--percentiles")
    doc = reanalyse(path, records, samples, percentiles, knee_gain, knee_latency)
    if not doc.complete and not any(t.levels for t in doc.targets):
        # Killed before its first summary (run.json is rewritten every few seconds): say so.
        _console().print(f"loadgen {doc.kind}  [incomplete]: stopped before a level was summarised; "
                         f"{len(records)} request records were written", markup=False, highlight=False)
        return
    print_run(doc, _console(), _console(stderr=True), output_format, records=kept_records(doc, records))
    if output_format in ("table", "markdown"):
        _kind_answer(path, doc, _console())
    if output_format == "table":
        from ..output.router import print_router

        print_router(_console(), kept_records(doc, records), path)  # a --models run (docs/router.md)


def _crossover_again(grid_dir: Path) -> None:
    """The crossover question last asked of this grid (crossover.json), asked again of its runs."""
    from ..analysis.crossover import crossover
    from ..output.crossover import crossover_lines
    from ..results.crossover import CROSSOVER_FILE, saved_question, spec_sides

    question = saved_question(grid_dir)
    if question is None:
        return
    try:
        on, off = spec_sides(grid_dir, question.param, question.on, question.off)
    except UserError as exc:  # the grid changed under the question: say so, the grid is still shown
        _console(stderr=True).print(f"crossover ({CROSSOVER_FILE}): {exc}", highlight=False, markup=False)
        return
    console = _console()
    console.print(f"crossover of {question.param}: {question.on} (on) vs {question.off} (off)", highlight=False,
                  markup=False)
    for line in crossover_lines(crossover(on, off, question.confidence)):
        console.print(line, highlight=False, markup=False)


def _kind_answer(path: Path, doc: RunDocument, console: Console) -> None:
    """The run kind's answer in one sentence (a capacity run's), after its tables."""
    from ..output.kind_view import view_of
    from ..output.tables import say

    answer = view_of(doc).answer
    line = answer(path, doc) if answer is not None else None
    if line is not None:
        say(console, line)
