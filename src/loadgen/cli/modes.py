"""`loadgen prefill`, `loadgen depth` and `loadgen soak`: the field reports' other experiments.

Thin: options are read and checked here, the measuring is in run/steps.py (prefill, depth) and
run/soak.py, the figures in the pure summary functions of analysis/prefill.py, depth.py and
soak.py, the tables in output/tables.py.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from ..core import columnar
from ..core.errors import EXIT_FAILED, EXIT_OK
from ..core.rundoc import RunDocument, RunKind
from .common import results_folder
from .env import machine_config, machine_options
from .help import command
from .live import prometheus_options, serving_live_metrics
from .options import DEPTHS, DURATION, PROMPT_LENGTHS
from .shared import (
    checking_only,
    console,
    describe,
    prompt_source,
    prompt_source_options,
    records_options,
    request_options,
    target_options,
)
from .slo import build_slo, slo_options
from .workers import resolve_workers, workers_option

if TYPE_CHECKING:
    from ..run.config import MachineOptions, SweepConfig
    from ..run.level_runner import LevelRunner
    from ..run.session import Execution
    from ..run.state import Run, RunObserver


def base_config(*, ports: tuple[int, ...] | None, host: str, urls: tuple[str, ...], labels: tuple[str, ...],
                server_urls: tuple[str, ...] = (),
                api: str, model: str | None, api_key: str | None, transport: str, insecure: bool,
                temperature: float, seed: int | None,
                timeout_s: float, wait_ready_s: float, warmup: int, n_predict: int, ignore_eos: bool = True,
                stream: bool = False, concurrency: int = 1, probe_interval_s: float = 0.25,
                machine: MachineOptions | None = None) -> SweepConfig:
    """Targets, API and request settings as a sweep would hold them (one level); `machine`: what
    the run reads of the machine under it (None: the defaults)."""
    from ..client.backends import GenerationParams
    from ..run.config import DEFAULT_PROMPT, MachineOptions, SweepConfig, build_targets, check_api

    return SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=(concurrency,),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict, temperature=temperature,
                                    ignore_eos=ignore_eos, seed=seed, stream=stream),
        api=check_api(api, model, api_key), model=model, api_key=api_key, warmup=warmup, timeout_s=timeout_s,
        wait_ready_s=wait_ready_s, probe_interval_s=probe_interval_s, transport=transport, insecure=insecure,
        machine=machine or MachineOptions())


def _finish(execution: Execution, out_dir: Path, err: Console) -> int:
    from ..output.tables import print_run

    doc = execution.doc
    print_run(doc, console(), err, live=True)
    err.print(f"results: {out_dir}", highlight=False)
    if execution.exit_code_for_signal is not None:
        return execution.exit_code_for_signal
    typed = RunDocument.of(doc)
    if any(t.error for t in typed.targets):
        return EXIT_FAILED
    if not any(t.levels or any(r.requests_ok for r in getattr(t.section(typed.kind), "rows", []))
               for t in typed.targets):
        err.print("nothing was measured: every step was skipped", style="red", highlight=False)
        return EXIT_FAILED
    return EXIT_OK


def _run(run: Run, out_dir: Path, main: Callable, err: Console, records_kept: str = "all",
         records_format: str = "jsonl", checkpoint_every_s: float | None = None) -> None:
    """Execute `run` into `out_dir`, checkpointing every `checkpoint_every_s` seconds (None: run.session's
    SUMMARY_EVERY_S)."""
    from ..results.writer import RunFiles
    from ..run.session import SUMMARY_EVERY_S, FinalWriteError, execute
    from ..run.workers.policy import remove_worker_files

    try:
        execution = execute(run, RunFiles(out_dir, records_kept, records_format), main, err=err,
                            checkpoint_every_s=SUMMARY_EVERY_S if checkpoint_every_s is None else checkpoint_every_s)
    except FinalWriteError as exc:
        err.print(f"loadgen: error: {exc}", style="red", highlight=False, markup=False)
        sys.exit(EXIT_FAILED)
    remove_worker_files(out_dir)
    sys.exit(_finish(execution, out_dir, err))


def _level_runner(run: Run, out_dir: Path, obs: RunObserver) -> AbstractAsyncContextManager[LevelRunner]:
    """What sends the levels: this process, or the --workers (soak); their histograms into RESULTS."""
    from ..output.worker_hlog import write_worker_hlog
    from ..run.workers.policy import open_level_runner

    return open_level_runner(run.config, out_dir, obs, functools.partial(write_worker_hlog, out_dir))


@command("prefill")
@target_options
@click.option("--prompt-tokens", type=PROMPT_LENGTHS, default="512,2048,8192", show_default=True,
              help="Prompt lengths in tokens, each cut exactly for each server with its /tokenize.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Requests per server and length; figures are mean ± sd over them.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Unrecorded requests per target first, with the shortest prompt.")
@prompt_source_options
@request_options
@machine_options
def prefill_command(ports, host, urls, labels, server_urls,
                    api, model, api_key, transport, insecure, prompt_tokens, repeat,
                    warmup, prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed, temperature,
                    seed, timeout_s, wait_ready_s, output, force, sysfs, procfs, env_interval_s, idle_s,
                    telemetry_urls, record_environment) -> None:
    """Prefill speed per prompt length: prompt_n, prompt_ms, prompt tok/s and client TTFT per server."""
    from ..output.progress import StepProgress
    from ..run.state import Run
    from ..run.steps import run_steps

    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls,
                       api=api, model=model, api_key=api_key,
                       transport=transport, insecure=insecure,
                       temperature=temperature, seed=seed, timeout_s=timeout_s, wait_ready_s=wait_ready_s,
                       warmup=warmup, n_predict=1,
                       machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls,
                                              record_environment))
    run = Run(base, RunKind.PREFILL, {"prompt_tokens": list(prompt_tokens), "repeat": repeat, "n_predict": 1,
                                    "concurrency": [1], "prompt_source": describe(source)})
    if checking_only():
        return
    out_dir = results_folder(output, force, "prefill")
    err = console(stderr=True)

    async def main(checkpoint) -> None:
        with StepProgress(err, "prefill", on_step_done=checkpoint) as obs:
            async with _level_runner(run, out_dir, obs) as runner:
                await run_steps(run, obs, source, prompt_tokens, n_predict=1, repeat=repeat, salt_only_below=False,
                                runner=runner)

    _run(run, out_dir, main, err)


@command("depth")
@target_options
@click.option("--depths", type=DEPTHS, default="0,4096,32768", show_default=True,
              help="Context depths in tokens: the prompt fills the context this far before decoding.")
@click.option("--n-predict", type=click.IntRange(min=2), default=64, show_default=True,
              help="Tokens to generate at each depth (decode speed is measured over them).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Requests per server and depth; figures are mean ± sd over them.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Unrecorded requests per target first, at the lowest depth.")
@prompt_source_options
@request_options
@machine_options
def depth_command(ports, host, urls, labels, server_urls,
                  api, model, api_key, transport, insecure, depths, n_predict, repeat,
                  warmup, prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed, temperature,
                  seed, timeout_s, wait_ready_s, output, force, sysfs, procfs, env_interval_s, idle_s,
                  telemetry_urls, record_environment) -> None:
    """Decode speed after a context filled to each depth, and its drop against depth 0 (llama-bench -d)."""
    from ..output.progress import StepProgress
    from ..run.state import Run
    from ..run.steps import run_steps

    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls,
                       api=api, model=model, api_key=api_key,
                       transport=transport, insecure=insecure,
                       temperature=temperature, seed=seed, timeout_s=timeout_s, wait_ready_s=wait_ready_s,
                       warmup=warmup, n_predict=n_predict,
                       machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls,
                                              record_environment))
    run = Run(base, RunKind.DEPTH, {"depths": list(depths), "repeat": repeat, "n_predict": n_predict,
                                  "concurrency": [1], "prompt_source": describe(source)})
    if checking_only():
        return
    out_dir = results_folder(output, force, "depth")
    err = console(stderr=True)

    async def main(checkpoint) -> None:
        with StepProgress(err, "depth", on_step_done=checkpoint) as obs:
            async with _level_runner(run, out_dir, obs) as runner:
                await run_steps(run, obs, source, depths, n_predict=n_predict, repeat=repeat, salt_only_below=True,
                                runner=runner)

    _run(run, out_dir, main, err)


@command("soak")
@target_options
@click.option("--concurrency", type=click.IntRange(min=1, max=4096), default=2, show_default=True,
              help="Workers per target, each sending requests back to back.")
@click.option("--duration", "duration_s", type=DURATION, default="1h", show_default=True,
              help="How long to keep the load on: seconds, or 90s, 30m, 6h, 1h30m.")
@click.option("--checkpoint-interval", "checkpoint_interval_s", type=DURATION, default="60s", show_default=True,
              help="Write the results so far this often; a crash or Ctrl-C loses at most this much.")
@click.option("--n-predict", type=click.IntRange(min=1), default=96, show_default=True, help="Tokens to generate.")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Generate exactly --n-predict tokens, so throughput is comparable over time.")
@click.option("--stream/--no-stream", default=False, show_default=True,
              help="Stream the responses (SSE) and record time to first token and inter-token gaps.")
@click.option("--prompt-tokens", type=click.IntRange(min=1),
              help="Cut the prompt to exactly this many tokens for each server.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unrecorded requests per target before the soak starts.")
@click.option("--probe-interval", "probe_interval_s", type=click.FloatRange(min=0), default=5, show_default=True,
              help="Seconds between scrapes of each server's /metrics and /slots; 0: none.")
@records_options
@prompt_source_options
@request_options
@slo_options
@prometheus_options
@workers_option
@machine_options
def soak_command(ports, host, urls, labels, server_urls,
                 api, model, api_key, transport, insecure, concurrency, duration_s,
                 checkpoint_interval_s, n_predict, ignore_eos, stream, prompt_tokens, warmup, probe_interval_s, prompt,
                 prompt_file, dataset, dataset_field, dataset_samples, dataset_seed, temperature, seed, timeout_s,
                 wait_ready_s, output, force, slo_text, attainment, prometheus_port, prometheus_host,
                 prometheus_linger_s, workers, ray_address, records_kept, records_format, sysfs, procfs,
                 env_interval_s, idle_s, telemetry_urls, record_environment) -> None:
    """Steady load for hours: errors by kind, error-free time and throughput drift, checkpointed as it goes."""
    from ..output.progress import SoakStatus
    from ..run.config import SoakSettings
    from ..run.soak import run_soak
    from ..run.state import Run
    from ..run.workers.policy import check_one_target

    slo = build_slo(slo_text, attainment, stream=stream, several_processes=workers != 1 or ray_address is not None)
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls,
                       api=api, model=model, api_key=api_key,
                       transport=transport, insecure=insecure,
                       temperature=temperature, seed=seed, timeout_s=timeout_s, wait_ready_s=wait_ready_s,
                       warmup=warmup, n_predict=n_predict, ignore_eos=ignore_eos, stream=stream,
                       concurrency=concurrency, probe_interval_s=probe_interval_s,
                       machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls,
                                              record_environment))
    if not prompt_tokens and not source.synthetic:
        base = replace(base, generation=replace(base.generation, prompt=source.texts[0], prompts=source.texts))
    base = resolve_workers(workers, ray_address, replace(base, slo=slo))
    check_one_target(base, "soak")
    settings = SoakSettings(concurrency=concurrency, duration_s=duration_s, checkpoint_interval_s=checkpoint_interval_s,
                            prompt_tokens=prompt_tokens, probe_interval_s=probe_interval_s,
                            prompt_source=describe(source))
    run = Run(base, RunKind.SOAK, settings)
    if checking_only():
        return
    out_dir = results_folder(output, force, "soak")
    err = console(stderr=True)
    if records_format == "parquet":
        columnar.schema()  # pyarrow is there, or one line saying how to get it, before any request

    with serving_live_metrics(prometheus_port, prometheus_host, prometheus_linger_s, (concurrency,), err,
                              slo) as live:
        async def main(checkpoint) -> None:
            with SoakStatus(err, duration_s, log_every_s=checkpoint_interval_s) as status:
                obs = live.observe(status) if live else status
                async with _level_runner(run, out_dir, obs) as runner:
                    await run_soak(run, obs, source, settings, runner)

        _run(run, out_dir, main, err, records_kept, records_format, checkpoint_every_s=checkpoint_interval_s)


