"""`loadgen capacity`: the most concurrent users (or req/s) a server serves within latency targets.

Builds the config and the search settings (validated once, here), runs the search (run/capacity.py),
writes the run as a sweep of the levels it probed (so analyze, report and export read it) plus
capacity.json (the answer), and prints the tables and the answer, or `{"capacity": ...}` with
--format json.
"""

from __future__ import annotations

import functools
import json
import math
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ...analysis.capacity_search import DEFAULT_HOLD_S, DEFAULT_NOISE, DEFAULT_REPEAT
from ...cli.common import results_folder
from ...cli.help import command
from ...cli.options import DURATION
from ...cli.request_features import feature_options
from ...cli.shared import (
    checking_only,
    format_option,
    history_options,
    length_options,
    prompt_source,
    prompt_source_options,
    records_options,
    request_options,
    target_options,
)
from ...cli.shared import console as _console
from ...cli.slo import build_slo, slo_options
from ...core.errors import EXIT_FAILED, ConfigError, UserError
from ...core.rundoc import RunKind
from ...core.workload import Workload
from ...results.atomic import write_json
from ...results.schema import CAPACITY_FILE

if TYPE_CHECKING:
    from ...run.capacity import CapacitySettings
    from ...run.config import SweepConfig

__all__ = ["capacity_command", "execute_capacity", "parse_budget"]


def parse_budget(text: str | None) -> tuple[int | None, float | None]:
    """--budget: a request count ("400") or a time ("90s", "10m", "1h") -> (requests, seconds)."""
    if text is None:
        return None, None
    t = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if t and t[-1] in units:
            seconds = float(t[:-1]) * units[t[-1]]
            if seconds > 0 and math.isfinite(seconds):
                return None, seconds
        elif int(t) > 0:
            return int(t), None
    except ValueError:
        pass
    raise ConfigError(f"--budget {text!r}: give a request count (400) or a time (90s, 10m, 1h) above 0")


@command()
@target_options
@slo_options
@click.option("--by", type=click.Choice(("concurrency", "rate")), default="concurrency", show_default=True,
              help="Search concurrent users (closed loop) or request rates (open loop, Poisson arrivals).")
@click.option("--max-concurrency", "max_level", type=float, default=64, show_default=True,
              help="The highest level the search may try (users, or req/s with --by rate).")
@click.option("--start", "start", type=float, default=1, show_default=True,
              help="The first level (users, or req/s with --by rate); when it fails the search halves downwards "
                   "from it until a level passes.")
@click.option("--at-least", is_flag=True,
              help="Only ask whether the capacity reaches --start: when --start does not pass the search stops there "
                   "(nothing below it is searched); when it passes the search climbs as usual.")
@click.option("--arrival-seed", type=int, default=0, show_default=True,
              help="By rate: seed of the first run's arrival schedule; each further run of a level adds 1.")
@click.option("--budget", "budget_text", help="Stop before the requests would pass this count (400) or once this "
                                              "much time has passed (90s, 10m); the answer so far is given.")
@click.option("--hold", "hold_s", type=DURATION, default=DEFAULT_HOLD_S, show_default=True,
              help="By rate: the fresh run an answer must hold on (seconds, or 2m); a rate passes only when a run "
                   "this long at it would meet the targets 19 times in 20.")
@click.option("--repeat", type=click.IntRange(min=1), default=DEFAULT_REPEAT, show_default=True,
              help="Run a level near the line up to this many times; if the runs disagree it is inconclusive.")
@click.option("--noise", type=click.FloatRange(min=0), default=DEFAULT_NOISE, show_default=True,
              help="A level within this share of its target (at the attainment quantile) is near the line: "
                   "the run-to-run noise (see `loadgen calibrate`).")
@click.option("--requests", "requests_per_level", type=click.IntRange(min=1),
              help="Requests per level [default: max(8, 4×concurrency); by rate max(40, 30 s worth)].")
@click.option("--duration", "duration_s", type=DURATION, help="Time per level instead of a request count.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unrecorded requests before the first level.")
@click.option("--stream/--no-stream", default=False, show_default=True,
              help="Stream the responses (SSE): needed for ttft, ttfa, tpot and itl targets.")
@prompt_source_options
@length_options
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Generate exactly --n-predict tokens.")
@feature_options
@request_options
@click.option("--probe-interval", "probe_interval_s", type=click.FloatRange(min=0), default=0.25, show_default=True,
              help="Seconds between scrapes of the server's /metrics and /slots during a level.")
@records_options
@history_options
@format_option
def capacity_command(ports, host, urls, labels, api, model, api_key, transport, insecure, server_urls, slo_text,
                     attainment, by, max_level, start, at_least, arrival_seed, budget_text, hold_s, repeat, noise, requests_per_level, duration_s, warmup,
                     stream, prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed, prompt_tokens,
                     n_predict, dataset_answer_field, workload_seed, ignore_eos,
                     request, output, force, probe_interval_s,
                     records_kept, records_format, output_format, json_schema=None, grammar_file=None, tools=None,
                     tool_choice=None, **image_args) -> None:
    """Find the most concurrent users (or req/s) a server serves within latency targets (--slo), and why."""
    from ...cli.request_features import image_features, request_features
    from ...cli.sweep import connections_needed, ensure_open_files, sweep_lengths
    from ...client.backends import GenerationParams
    from ...run.capacity import RATE_LEVEL_LEAST, CapacitySettings
    from ...run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api

    slo = build_slo(slo_text, attainment, stream=stream, required=True)
    assert slo is not None
    by_rate = by == "rate"
    max_level, start = checked_levels(by_rate, max_level, start, requests_per_level, duration_s, hold_s)
    budget_requests, budget_s = parse_budget(budget_text)
    targets = build_targets(host, ports, urls, labels, server_urls)
    if len(targets) != 1:
        raise ConfigError("capacity searches one server at a time; give one --ports or --url")
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    source, prompt_tokens, n_predict, workload, entries = sweep_lengths(
        source, Workload(prompt_tokens, n_predict, seed=workload_seed), dataset, dataset_field, dataset_answer_field,
        dataset_samples, dataset_seed)
    texts = source.texts or (DEFAULT_PROMPT,)
    config = SweepConfig(
        targets=targets, concurrency=(max_level,) if not by_rate else (1,), rates=(float(start),) if by_rate else (),
        model=model, api_key=api_key,
        generation=GenerationParams(prompt=texts[0], prompts=texts if len(texts) > 1 else (), n_predict=n_predict,
                                    **request.generation(), stream=stream,
                                    **request_features(json_schema, grammar_file, tools, tool_choice, api, ignore_eos),
                                    images=image_features(api=api, **image_args)),
        api=check_api(api, model, api_key), requests_per_level=requests_per_level, duration_s=duration_s,
        warmup=warmup, **request.config(), probe_interval_s=probe_interval_s,
        prompt_tokens=prompt_tokens, workload=workload, dataset_entries=entries,
        prompt_source=source, transport=transport, insecure=insecure, slo=slo,
        open_loop_least=RATE_LEVEL_LEAST, arrival_seed=arrival_seed)  # only a rate (open-loop) level reads it
    settings = CapacitySettings(by_rate=by_rate, max_level=max_level, start=start, repeat=repeat, noise=noise,
                                budget_requests=budget_requests, budget_s=budget_s, hold_s=hold_s, at_least=at_least)
    ensure_open_files(connections_needed(config))
    if checking_only():
        return
    out_dir = results_folder(output, force, "capacity")
    sys.exit(execute_capacity(config, settings, out_dir, output_format, records_kept, records_format))


def checked_levels(by_rate: bool, max_level: float, start: float, requests_per_level: int | None,
                   duration_s: float | None, hold_s: float) -> tuple[int | float, int | float]:
    """The search's cap and first level, checked against each other and the level's length (whole users
    by concurrency, rates above 0 by rate); a ConfigError in one sentence for what does not fit."""
    if requests_per_level is not None and duration_s is not None:
        raise ConfigError("give --requests (a count per level) or --duration (a time per level), not both")
    if not by_rate and hold_s != DEFAULT_HOLD_S:
        raise ConfigError("--hold is the fresh run a rate's answer must hold on: it applies to --by rate only")
    if not by_rate:
        if max_level != int(max_level) or max_level < 1:
            raise ConfigError(f"--max-concurrency {max_level:g}: give a whole number of users, 1 or more")
        if requests_per_level is not None and requests_per_level < max_level:
            raise ConfigError(f"--requests {requests_per_level} is fewer than --max-concurrency {int(max_level)}: "
                              f"that level could never have {int(max_level)} requests in flight; give more, or "
                              "--duration")
    elif not (0 < max_level < math.inf):
        raise ConfigError("--max-concurrency (the highest rate with --by rate) must be a number above 0")
    if by_rate and not (0 < start < math.inf):
        raise ConfigError(f"--start {start:g}: give a rate above 0 req/s")
    if not by_rate and (start != int(start) or start < 1):
        raise ConfigError(f"--start {start:g}: give a whole number of users, 1 or more")
    if start > max_level:
        raise ConfigError(f"--start {start:g} is above --max-concurrency {max_level:g}: the search never runs a level "
                          "above the cap; lower --start or raise the cap")
    return (max_level, start) if by_rate else (int(max_level), int(start))


def execute_capacity(config: SweepConfig, settings: CapacitySettings, out_dir: Path, output_format: str = "table",
                     records: str = "all", records_format: str = "jsonl") -> int:
    """Run the search, write its results (run.json as a sweep, capacity.json), print. The exit code."""
    from ...cli.sweep import run_exit_code
    from ...output.capacity_answer import capacity_document
    from ...output.progress import ProgressObserver
    from ...output.tables import print_run, say
    from ...output.worker_hlog import write_worker_hlog
    from ...results.writer import RunFiles
    from ...run.capacity import CapacitySearch, run_capacity
    from ...run.session import FinalWriteError, execute
    from ...run.state import Run
    from ...run.workers.policy import open_level_runner, remove_worker_files

    console, err = _console(), _console(stderr=True)
    run = Run(config, RunKind.CAPACITY, {"capacity": settings.to_dict()})
    search = CapacitySearch(run, settings)

    async def main(checkpoint: Callable[[], None]) -> None:
        with ProgressObserver(err, on_level_done=checkpoint) as observer:
            # the runner the config asks for (this process: --slo judges every record here)
            async with open_level_runner(run.config, out_dir, observer,
                                         functools.partial(write_worker_hlog, out_dir)) as runner:
                await run_capacity(run, observer, search, runner)

    try:
        execution = execute(run, RunFiles(out_dir, records, records_format), main, err=err)
    except FinalWriteError as exc:
        raise UserError(str(exc), EXIT_FAILED) from None
    remove_worker_files(out_dir)
    doc = execution.doc
    search.settle(signal.Signals(execution.signals[0]).name if execution.signals else None)
    answer = search.answer()
    result = capacity_document(answer, doc, config.slo, settings, search.history, search.ended, search.cut_short)
    try:
        write_json(out_dir / CAPACITY_FILE, {"capacity": result})
    except OSError as exc:
        err.print(f"warning: could not write {CAPACITY_FILE} ({exc})", style="yellow")
    if output_format == "json":
        console.file.write(json.dumps({"capacity": result}, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    else:
        print_run(doc, console, err, output_format, live=True)
        say(err if output_format == "csv" else console, result["verdict"])  # CSV on stdout stays CSV
        if search.ended:
            say(err, f"search ended: {search.ended}", "dim")
    err.print(f"results: {out_dir}", highlight=False)
    return run_exit_code(execution)
