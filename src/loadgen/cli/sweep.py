"""`loadgen sweep` and `loadgen demo`: build the sweep's config (validated once, here), run it, print it."""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from ..analysis.slo import DEFAULT_ATTAINMENT
from ..analysis.trim import Trim
from ..client.backends import ANSWER_APIS, REASONING_EFFORTS, GenerationParams
from ..core import columnar
from ..core.errors import EXIT_FAILED, EXIT_OK, ConfigError, UserError
from ..core.request_class import RequestClass, check_classes
from ..core.rundoc import RunDocument, RunKind
from ..core.workload import LengthSpec, Workload
from ..run.config import (
    DEFAULT_PROMPT,
    SweepConfig,
    build_targets,
    check_api,
    check_arrival,
    check_items,
    check_reasoning_effort,
)
from ..run.prompts import PromptSource, sample_prompts
from ..run.schedule import ARRIVALS
from .common import results_folder
from .env import machine_config, machine_options
from .help import command
from .live import prometheus_options, serving_live_metrics
from .options import DURATION, LEVELS, LORA_MIX, MODEL_MIX, PERCENTILES, RATES, REQUEST_CLASS, TRIM, IntList
from .request_features import feature_options, image_features, request_features
from .shared import (
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
from .shared import console as _console
from .slo import build_slo, slo_options
from .workers import resolve_workers, workers_option

if TYPE_CHECKING:
    from ..run.dataset_answers import DatasetEntry
    from ..run.live.metrics import LiveMetrics
    from ..run.session import Execution
    from ..run.state import Run


@command()
@target_options
@click.option("--concurrency", type=LEVELS, help="Concurrency levels to sweep (closed loop) [default: 1,2,4,8].")
@click.option("--rate", "rates", type=RATES, help="Request rates (requests/s) to sweep instead, open loop, "
                                                  "e.g. 0.5,1,2,4; inf sends a level's --requests all at once.")
@click.option("--arrival", type=click.Choice(ARRIVALS), default="poisson", show_default=True,
              help="Open loop: the arrival process of the requests.")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="Open loop, --arrival gamma: the gamma shape (1 = Poisson, <1 burstier, >1 more regular).")
@click.option("--max-in-flight", type=click.IntRange(min=1),
              help="Open loop: at most this many requests in flight; late sends still count from their intended time.")
@click.option("--arrival-seed", type=int, default=0, show_default=True, help="Open loop: seed of the arrival schedule.")
@click.option("--requests", "requests_per_level", type=click.IntRange(min=1),
              help="Requests per level [default: max(8, 4×concurrency); open loop max(16, 20 s worth)].")
@click.option("--duration", "duration_s", type=DURATION, help="Time per level instead of a request count: "
                                                              "seconds, or 90s, 5m.")
@click.option("--stagger", "stagger_s", type=click.FloatRange(min=0), default=0, show_default=True,
              help="Closed loop: spread the workers' first sends evenly over this many seconds (worker i at "
                   "i×S/C) instead of starting them all at once, so requests of one shape do not stay in phase.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unrecorded requests per target before the first level.")
@click.option("--stream/--no-stream", default=False, show_default=True,
              help="Stream the responses (SSE) and record time to first token and inter-token gaps.")
@click.option("--items", type=click.IntRange(min=1), default=1, show_default=True,
              help="--api embeddings or rerank: texts per request (inputs, or documents to rank).")
@prompt_source_options
@length_options
@click.option("--class", "request_classes", type=REQUEST_CLASS, multiple=True,
              metavar="name=N,prompt_tokens=T,n_predict=P,concurrency=C|rate=R[,requests=K][,slo=...]",
              help="A request class (repeatable; a scenario file's [[class]] tables): classes replace the "
                   "levels; each runs alone, then all together against the same server, and each is "
                   "compared with itself alone (docs/workloads.md).")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Generate exactly --n-predict tokens, so throughput is comparable.")
@click.option("--reasoning-effort", type=click.Choice(REASONING_EFFORTS),
              help="A reasoning model's effort, sent as the API expects (chat: reasoning_effort; responses: "
                   "reasoning.effort).")
@feature_options
@click.option("--lora-mix", type=LORA_MIX, metavar="ID:W,...",
              help="llama-server LoRA adapters per request: weights over the server's adapter ids (from its "
                   "/lora-adapters) and none, e.g. 0:1,1:1,none:1; each request carries its `lora` and its "
                   "record the adapter (docs/lora.md).")
@click.option("--models", "model_mix", type=MODEL_MIX, metavar="NAME:W,...|all",
              help="llama-server router mode: spread requests over the router's models by weight (ids from its "
                   "/models), e.g. smol-a:2,smol-b:1, or all; each request names its `model` and its record "
                   "the model; per-model cold loads and a thrash verdict after the run (docs/router.md).")
@request_options
@click.option("--probe-interval", "probe_interval_s", type=click.FloatRange(min=0), default=0.25, show_default=True,
              help="Seconds between scrapes of each server's /metrics and /slots during a level (a level's "
                   "first 8 come 4x as often); 0: no scrape during levels.")
@click.option("--knee-gain", type=click.FloatRange(min=0), default=0.10, show_default=True,
              help="Saturation: the next level raises throughput by less than this share...")
@click.option("--knee-latency", type=click.FloatRange(min=0), default=0.50, show_default=True,
              help="...while mean latency rises by more than this share.")
@click.option("--parallel-targets", is_flag=True, help="Load all targets at the same time instead of one after another.")
@records_options
@history_options
@click.option("--histograms/--no-histograms", default=True, show_default=True,
              help="Write .hgrm percentile distributions per target, level and metric into RESULTS/histograms.")
@click.option("--percentiles", type=PERCENTILES, default=None,
              help="Keep these percentiles of TTFT, latency, TPOT and ITL per level (e.g. 50,95,99.9): in run.json, "
                   "exports and the tables, which show them instead of the fixed p50/p99/max.")
@click.option("--trim", type=TRIM, default=None,
              help="Leave each level's warm-up and cool-down out of its figures: the requests started in the first "
                   "and last 10% (or 5s) of its window; their records are kept, the count is in the table note.")
@slo_options
@click.option("--stop-at-knee", is_flag=True,
              help="End the ladder once a level is past the saturation knee, or (with --slo) clearly misses the "
                   "targets; one target only.")
@format_option
@prometheus_options
@workers_option
@machine_options
def sweep(ports, host, urls, labels, api, model, api_key, concurrency, rates, arrival, burstiness, max_in_flight,
          arrival_seed, requests_per_level, duration_s, stagger_s, warmup, stream, prompt, prompt_file, dataset,
          dataset_field, dataset_samples, dataset_seed, prompt_tokens, n_predict, dataset_answer_field,
          request_classes, workload_seed, ignore_eos, reasoning_effort, lora_mix, model_mix,
          request, output, force, probe_interval_s, knee_gain, knee_latency, parallel_targets,
          histograms, transport, insecure,
          output_format, prometheus_port, prometheus_host, prometheus_linger_s, workers, ray_address, records_kept,
          records_format, sysfs, procfs, env_interval_s, idle_s, telemetry_urls, record_environment, slo_text=None,
          attainment=DEFAULT_ATTAINMENT, stop_at_knee=False, server_urls=(), percentiles=None, trim=None,
          json_schema=None, grammar_file=None, tools=None, tool_choice=None, items=1, **image_args) -> None:
    """Sweep concurrency levels (or request rates) against one or more servers, side by side."""
    if request_classes:  # they replace the levels
        concurrency = check_classes_flags(request_classes, concurrency, rates, prompt_tokens, n_predict, duration_s,
                                          stream, workers, ray_address, stop_at_knee)
    check_budget(concurrency, rates, requests_per_level, duration_s)
    if rates is None and (max_in_flight is not None or arrival != "poisson" or burstiness != 1.0):
        raise ConfigError("--arrival, --burstiness and --max-in-flight need --rate")
    check_stagger(stagger_s, rates, duration_s)
    slo = check_processes(api, items, rates, trim, (lora_mix, model_mix), slo_text, attainment, stream, prompt_tokens,
                          several=workers != 1 or ray_address is not None)
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    source, prompt_tokens, n_predict, workload, entries = sweep_lengths(
        source, Workload(prompt_tokens, n_predict, seed=workload_seed), dataset, dataset_field, dataset_answer_field,
        dataset_samples, dataset_seed)
    texts = source.texts or (DEFAULT_PROMPT,)
    config = SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls),
        concurrency=(1, 2, 4, 8) if concurrency is None else concurrency,
        rates=rates or (),
        arrival=check_arrival(arrival, burstiness), burstiness=burstiness, max_in_flight=max_in_flight,
        arrival_seed=arrival_seed, model=model, api_key=api_key,
        generation=GenerationParams(prompt=texts[0], prompts=texts if len(texts) > 1 else (),
                                    n_predict=0 if api in ANSWER_APIS else n_predict,  # they generate nothing
                                    **request.generation(), stream=stream,
                                    reasoning_effort=check_reasoning_effort(reasoning_effort, api), items=items,
                                    lora_mix=lora_mix, model_mix=model_mix,
                                    images=image_features(api=api, **image_args),
                                    **request_features(json_schema, grammar_file, tools, tool_choice, api, ignore_eos)),
        api=check_api(api, model, api_key, answers=True), requests_per_level=requests_per_level,
        duration_s=duration_s, stagger_s=stagger_s, warmup=warmup, **request.config(),
        parallel_targets=parallel_targets, probe_interval_s=probe_interval_s, knee_gain=knee_gain, knee_latency=knee_latency,
        prompt_tokens=prompt_tokens, prompt_source=source, transport=transport, insecure=insecure, slo=slo,
        machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls, record_environment),
        workload=workload, dataset_entries=entries, percentiles=percentiles or (), trim=trim,
        classes=tuple(request_classes))
    config = check_scale(resolve_workers(workers, ray_address, config), stop_at_knee)
    if checking_only():
        return show_classes(config.classes)
    out_dir = results_folder(output, force, "sweep")
    if records_format == "parquet":
        columnar.schema()  # pyarrow is there, or one line saying how to get it, before any request
    with serving_live_metrics(prometheus_port, prometheus_host, prometheus_linger_s, config.levels,
                              _console(stderr=True), config.slo) as live:
        code = execute_sweep(config, out_dir, histograms=histograms, output_format=output_format, live=live,
                             records=records_kept, records_format=records_format, stop_at_knee=stop_at_knee)
    sys.exit(code)


def check_scale(config: SweepConfig, stop_at_knee: bool) -> SweepConfig:
    """What the resolved config cannot do, refused in one line: drawn lengths over several processes,
    --stop-at-knee with several targets, more connections than open files allow."""
    if config.workload is not None and (config.workers != 1 or config.ray_address is not None):
        raise ConfigError("drawn lengths (--prompt-tokens/--n-predict distributions) run in one process; "
                          "drop --workers/--ray")
    if stop_at_knee and len(config.targets) != 1:
        raise ConfigError("--stop-at-knee ends one server's ladder; give one target")
    ensure_open_files(connections_needed(config), config.open_loop and not config.classes)
    return config


def check_processes(api: str, items: int, rates: tuple[float, ...] | None, trim: Trim | None, mixes: Any,
                    slo_text: str | None, attainment: float, stream: bool, prompt_tokens: Any, several: bool) -> Any:
    """What must run in one process (`mixes`: --lora-mix's and --models'), the targets (--slo) and the
    answer APIs' --items, checked; the Slo."""
    lora_mix, model_mix = mixes if isinstance(mixes, tuple) else (mixes, None)
    if several and model_mix is not None:
        raise ConfigError("--models runs a level's requests in this process; run it without --workers (or --ray)")
    check_one_process(rates, trim, several=several, lora_mix=lora_mix is not None)
    slo = build_slo(slo_text, attainment, stream=stream, several_processes=several)
    check_items(api, items, stream=stream, several_processes=several, prompt_tokens=prompt_tokens is not None)
    return slo


def check_one_process(rates: tuple[float, ...] | None, trim: Trim | None, several: bool, lora_mix: bool = False) -> None:
    """--rate inf, --trim and --lora-mix need a level's every request in this process: refused with --workers/--ray."""
    if several and lora_mix:
        raise ConfigError("--lora-mix runs a level's requests in this process; run it without --workers (or --ray)")
    if several and rates is not None and math.inf in rates:
        raise ConfigError("--rate inf sends a level's requests at once from this process; run it without --workers")
    if several and trim is not None:
        raise ConfigError("--trim needs every record of a level in this process; run it without --workers (or --ray)")


def check_classes_flags(classes: tuple[RequestClass, ...], concurrency: tuple[int, ...] | None,
                        rates: tuple[float, ...] | None, prompt_tokens: LengthSpec | None, n_predict: LengthSpec,
                        duration_s: float | None, stream: bool, workers: int, ray_address: str | None,
                        stop_at_knee: bool) -> tuple[int, ...]:
    """Classes carry their own loads, lengths and budgets, and run in this process: the flags that
    would say otherwise are refused in one sentence, as is a class's --slo that cannot be judged.
    The run's one nominal level."""
    check_classes(classes, "--class")
    if concurrency is not None or rates:
        raise ConfigError("request classes carry their own load (concurrency or rate); drop --concurrency/--rate")
    if prompt_tokens is not None or n_predict.kind == "dataset":
        raise ConfigError("request classes carry their own lengths; drop --prompt-tokens and --n-predict dataset")
    if duration_s is not None:
        raise ConfigError("request classes send their own number of requests (requests = N); drop --duration")
    if workers != 1 or ray_address is not None:
        raise ConfigError("request classes run in one process; drop --workers/--ray")
    if stop_at_knee:
        raise ConfigError("--stop-at-knee ends a ladder of levels; request classes have none")
    for c in classes:
        if c.slo is not None:
            try:
                build_slo(c.slo, DEFAULT_ATTAINMENT, stream=stream)
            except ConfigError as exc:
                raise ConfigError(f"class {c.name}: {str(exc).replace('--slo', 'slo')}") from None
    return (1,)


def show_classes(classes: tuple[RequestClass, ...]) -> None:
    """--check: each class as it will run."""
    for c in classes:
        click.echo(f"class {class_text(c)}", err=True)


def class_text(c: RequestClass) -> str:
    """One class as --check shows it."""
    w = c.workload
    prompt = "prompts as given" if w.prompt_tokens is None else f"prompt_tokens {w.prompt_tokens.text}"
    return (f"{c.name}: {prompt}, n_predict {w.n_predict.text}, {c.load_text}, {c.requests} requests per phase"
            + (f", slo {c.slo}" if c.slo else ""))


def sweep_lengths(source: PromptSource, workload: Workload, dataset: str | None, field: str,
                  answer_field: str | None, samples: int | None, seed: int
                  ) -> tuple[PromptSource, Any, int, Workload | None, tuple[DatasetEntry, ...]]:
    """The run's prompts and lengths from --prompt-tokens/--n-predict (docs/workloads.md): the prompt
    source, the one prompt length and n_predict of a fixed shape (a drawn workload: none, and the
    largest answer), the workload when lengths vary or come from the dataset, and its entries."""
    prompt_tokens, n_predict = workload.prompt_tokens, workload.n_predict
    if workload.answers_from_dataset or answer_field is not None:
        source, entries = dataset_answers(workload, dataset, field, answer_field, samples, seed)
        # every body asks for its own answer's length; the prompt length spec is left as given
        return source, prompt_tokens, 96, workload, tuple(entries)
    if prompt_tokens is not None and prompt_tokens.kind == "dataset":
        raise ConfigError("--prompt-tokens dataset: a dataset gives answer lengths; write --n-predict dataset")
    if workload.varies:
        return source, None, max(s.n_predict for s in workload.draw()), workload, ()
    return source, prompt_tokens and prompt_tokens.fixed, n_predict.low, None, ()  # not varying: low is the fixed length


def dataset_answers(workload: Workload, dataset: str | None, field: str, answer_field: str | None,
                    samples: int | None, seed: int) -> tuple[PromptSource, list[DatasetEntry]]:
    """--n-predict dataset: the sampled entries that have an answer (and a note of those left out),
    and a prompt source of their prompts in the same order."""
    from ..run.dataset_answers import read_dataset_entries

    if not workload.answers_from_dataset:
        raise ConfigError("--dataset-answer-field needs --n-predict dataset")
    if dataset is None:
        raise ConfigError("--n-predict dataset needs --dataset (ShareGPT, or JSONL with --dataset-answer-field)")
    if workload.prompt_tokens is not None:
        raise ConfigError("--n-predict dataset sends each entry's own prompt: drop --prompt-tokens")
    entries, missing = read_dataset_entries(dataset, field, answer_field)
    if missing:
        click.echo(f"--dataset {dataset}: {missing} entries without an answer left out", err=True)
    entries = sample_prompts(entries, samples, seed)
    return PromptSource(tuple(e.prompt for e in entries), seed), entries


def check_budget(concurrency: tuple[int, ...] | None, rates: tuple[float, ...] | None,
                 requests_per_level: int | None, duration_s: float | None) -> None:
    """The level shape and budget flags taken together: one loop kind, one budget, and a request
    count that lets every closed-loop level reach its concurrency (as k6 refuses fewer iterations
    than virtual users)."""
    if concurrency is not None and rates is not None:
        raise ConfigError("give --concurrency (closed loop) or --rate (open loop), not both")
    if requests_per_level is not None and duration_s is not None:
        raise ConfigError("give --requests (a count per level) or --duration (a time per level), not both")
    if rates is not None and math.inf in rates and requests_per_level is None:
        raise ConfigError("--rate inf sends each level's requests all at once: say how many with --requests")
    top = max(concurrency or (1, 2, 4, 8)) if rates is None else 0
    if requests_per_level is not None and requests_per_level < top:
        raise ConfigError(f"--requests {requests_per_level} is fewer than concurrency {top}: that level could "
                          f"never have {top} requests in flight; give --requests {top} or more, or --duration")


def check_stagger(stagger_s: float, rates: tuple[float, ...] | None, duration_s: float | None) -> None:
    """--stagger spreads a closed loop's workers; an open loop has none, and a level shorter than
    the stagger would end before its last workers start."""
    if not stagger_s:
        return
    if rates is not None:
        raise ConfigError("--stagger spreads the workers of a closed loop (--concurrency); --rate sends on a schedule")
    if duration_s is not None and stagger_s >= duration_s:
        raise ConfigError(f"--stagger {stagger_s:g} s is not shorter than --duration {duration_s:g} s: "
                          "the last workers would never start")


# Descriptors besides the request connections: stdio, each target's probe session, result files,
# the event loop's own (epoll, self-pipe), the checkpoint thread.
FD_RESERVE = 64


def connections_needed(config: SweepConfig) -> int:
    """The most connections the sweep may hold open at once in one process (`most_in_flight`)."""
    return config.most_in_flight * (len(config.targets) if config.parallel_targets else 1)


def ensure_open_files(connections: int, open_loop: bool = False, workers: bool = True) -> None:
    """Make room for `connections` sockets: raise the soft RLIMIT_NOFILE up to the hard limit if it
    is too low, or refuse (ConfigError) before the sweep rather than fail requests with EMFILE.
    `open_loop`: the count is the requests a schedule holds (`SweepConfig.most_in_flight`), and the
    advice names the in-flight cap and (`workers`: the command takes --workers) worker processes."""
    try:
        import resource
    except ImportError:  # not on Windows
        return
    need = connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if connections == 0 or soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (ValueError, OSError):
            pass
    if not open_loop:
        raise ConfigError(f"{connections} connections need about {need} open files, but this process may open "
                          f"{soft} (hard limit {hard}); raise the limit (ulimit -n {need}) or lower the concurrency")
    cap = max(1, min(soft, hard if hard != resource.RLIM_INFINITY else soft) - FD_RESERVE)
    raise ConfigError(f"{connections} requests may be in flight at once (every request the schedule holds: "
                      f"how many stay in flight depends on the server's latency), each on its own connection, "
                      f"which needs about {need} open files, but this process may open {soft} (hard limit {hard}); "
                      f"raise the limit (ulimit -n {need})" + (", " if workers else " or ")
                      + f"cap the requests in flight (--max-in-flight {cap})"
                      + (" or spread them over processes (--workers)" if workers else ""))


def execute_sweep(config: SweepConfig, out_dir: Path, console: Console | None = None, *, kind: RunKind = RunKind.SWEEP,
                  around: Callable[[], AbstractAsyncContextManager] | None = None, histograms: bool = True,
                  output_format: str = "table", live: LiveMetrics | None = None, records: str = "all",
                  records_format: str = "jsonl", stop_at_knee: bool = False) -> int:
    """Run a sweep, print its table, write its results. Returns the exit code.

    `around` is entered on the sweep's event loop for the sweep's duration (the demo's simulators);
    `live` (--prometheus-port) is fed every level and request; `stop_at_knee` ends the ladder once
    it is past saturation or the SLO (run/stop_at_knee.py).
    """
    from ..output.progress import ProgressObserver
    from ..output.tables import print_run
    from ..output.worker_hlog import write_worker_hlog
    from ..results.writer import RunFiles
    from ..run.classes import run_classes
    from ..run.session import FinalWriteError, execute
    from ..run.state import Run
    from ..run.stop_at_knee import stop_at_knee as knee_plan
    from ..run.sweep import run_sweep
    from ..run.workers.policy import open_level_runner, remove_worker_files

    if config.classes and config.generation.model_mix is not None:
        raise ConfigError("--models spreads one load's requests over a router's models; run it without --class")
    console = console or _console()
    err = _console(stderr=True)
    run = Run(config, kind)

    async def main(checkpoint: Callable[[], None]) -> None:
        async with around() if around else contextlib.nullcontext():
            with ProgressObserver(err, on_level_done=checkpoint) as observer:
                obs = live.observe(observer) if live else observer
                if run.config.classes:  # one process (refused with --workers at the edge)
                    await run_classes(run, obs)
                    return
                async with open_level_runner(run.config, out_dir, obs,
                                             functools.partial(write_worker_hlog, out_dir)) as runner:
                    await run_sweep(run, obs, runner, plan=knee_plan(run, obs) if stop_at_knee else None)

    try:
        execution = execute(run, RunFiles(out_dir, records, records_format), main, err=err)
    except FinalWriteError as exc:
        raise UserError(str(exc), EXIT_FAILED) from None
    remove_worker_files(out_dir)
    doc = execution.doc
    write_histograms(out_dir, doc, run, histograms and not config.classes, err)
    print_run(doc, console, err, output_format, live=True, records=_lora_records(out_dir, doc))
    if run.config.generation.model_mix is not None:  # --models, or --model NAME of a router (run/router.py)
        _print_router(out_dir, run, doc, console if output_format == "table" else None)
    err.print(f"results: {out_dir}", highlight=False)
    return run_exit_code(execution)


def _lora_records(out_dir: Path, doc: RunDocument | dict[str, Any]) -> list[Any] | None:
    """A --lora-mix run's records, read back for its adapters' table (output/lora.py); None otherwise."""
    config = RunDocument.of(doc).config
    if config is None or config.lora_mix is None:
        return None
    from ..output.cache import kept_records
    from ..results.reader import load_records

    return kept_records(doc, load_records(out_dir))


def _print_router(out_dir: Path, run: Any, doc: Any, console: Console | None) -> None:
    """A --models run: the router's polled timeline written (router.json), its summary into run.json, its
    per-model table and verdict."""
    from ..output.cache import kept_records
    from ..output.router import print_router, summarize_router, write_timelines
    from ..results.reader import load_records

    write_timelines(out_dir, run.targets)
    records = kept_records(doc, load_records(out_dir))
    summarize_router(records, out_dir)  # into run.json: report and export show it
    if console is not None:  # JSON, CSV and Markdown on stdout hold their own tables only
        print_router(console, records, out_dir)


def run_exit_code(execution: Execution) -> int:
    """A finished run's exit code: the signal's (130, 143) when one stopped it, EXIT_FAILED when a
    target failed or no level was measured, else EXIT_OK."""
    if execution.exit_code_for_signal is not None:
        return execution.exit_code_for_signal
    typed = RunDocument.of(execution.doc)
    if any(t.error for t in typed.targets) or not any(t.levels for t in typed.targets):
        return EXIT_FAILED
    return EXIT_OK


def write_histograms(out_dir: Path, doc: dict[str, Any], run: Run, wanted: bool, err: Console) -> None:
    """Each level's .hgrm file under out_dir/histograms (`wanted`: --histograms, and no request
    classes, whose levels share a key so their files would collide); a warning when they cannot be."""
    from ..analysis.aggregate import of_level
    from ..output.exporters import is_hgrm_name, level_histogram_files
    from ..output.files import remove_files, write_files

    try:
        # An earlier run's .hgrm files (--force) would pass for this run's: loadgen's own names go
        # first, whatever else a user put there stays; with --no-histograms none are left either.
        remove_files(out_dir / "histograms", is_hgrm_name)
        if wanted:
            (out_dir / "histograms").mkdir(exist_ok=True)
            write_files(level_histogram_files(doc, [(t.label, lv.level, of_level(lv)) for t in run.targets
                                                    for lv in t.levels]), out_dir / "histograms")
    except OSError as exc:
        err.print(f"warning: could not write the histograms ({exc})", style="yellow")


@command()
@click.option("--time-scale", type=click.FloatRange(min=0.001, max=1), default=0.06, show_default=True,
              help="Scale the simulated servers' durations by this factor: 0.06 runs them about 17× faster "
                   "than the hardware they model (figures are reported in simulated time).")
@click.option("--concurrency", type=IntList(1, 64), default="1,2,4,8", show_default=True,
              help="Concurrency levels to sweep.")
@click.option("--output", type=click.Path(file_okay=False), help="Results directory [default: results/<UTC time>-demo].")
@click.option("--force", is_flag=True, help="Overwrite a results directory that already holds a run.")
def demo(time_scale, concurrency, output, force) -> None:
    """Sweep two simulated llama-servers (MoE vs dense, 4 slots each) in under a minute, no model needed.

    The simulators model the field report's Apple M1 Max servers (Qwen3.6-35B-A3B MoE and Qwen3.6-27B
    dense); they run `--time-scale` times faster and every figure is reported in simulated time.
    """
    from ..client.backends import GenerationParams
    from ..run.config import DEFAULT_PROMPT, SweepConfig, Target
    from ..sim import load_profile
    from .demo_servers import simulator_processes

    levels = concurrency
    profiles = [load_profile("moe-35b-a3b"), load_profile("dense-27b")]
    out_dir = results_folder(output, force, "demo")

    err = _console(stderr=True)
    err.print(f"loadgen demo: two simulated llama-servers, {profiles[0].name} and {profiles[1].name}, 4 slots each, "
              f"running {1 / time_scale:.0f}× faster than the hardware they model; figures are in simulated time.",
              highlight=False, soft_wrap=True)
    # The simulators run in processes of their own (demo_servers.py says why), so the client's
    # loop lag and CPU are its own, and judged as a sweep's are.
    with simulator_processes([p.name for p in profiles], slots=4, time_scale=time_scale, seed=1) as urls:
        config = SweepConfig(
            targets=tuple(Target(url, p.name) for url, p in zip(urls, profiles)),
            concurrency=levels, generation=GenerationParams(prompt=DEFAULT_PROMPT), time_scale=time_scale,
            wait_ready_s=10, probe_interval_s=max(0.01, 0.25 * time_scale * 4))
        code = execute_sweep(config, out_dir, kind=RunKind.DEMO)
    sys.exit(code)


def refuse_empty_levels(doc: RunDocument) -> int:
    """EXIT_FAILED, said in one line, when a level had no successful request (its cache figures
    are n/a, not a result); else EXIT_OK."""
    empty = [f"{t.label} at {lv.level:g}" for t in doc.targets for lv in t.levels if lv.requests_ok == 0]
    if not empty:
        return EXIT_OK
    _console(stderr=True).print(f"error: no request succeeded at {', '.join(empty)}: those levels have no cache "
                                "figures (see the errors above)", highlight=False, style="red")
    return EXIT_FAILED
