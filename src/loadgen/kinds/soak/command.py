"""`loadgen soak`: steady load for hours (command.py), run by run/soak.py, its figures in
analysis/soak.py, its table output/tables.py `soak_table`."""

from __future__ import annotations

from dataclasses import replace

import click

from ...cli.env import machine_options
from ...cli.help import command
from ...cli.live import prometheus_options
from ...cli.options import DURATION
from ...cli.shared import (
    checking_only,
    console,
    describe,
    prompt_source,
    prompt_source_options,
    records_options,
    request_options,
    target_options,
)
from ...cli.slo import build_slo, slo_options
from ...cli.workers import workers_option
from ...core import columnar
from ...core.rundoc import RunKind


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
                 prompt_file, dataset, dataset_field, dataset_samples, dataset_seed,
                 request, output, force, slo_text, attainment, prometheus_port, prometheus_host,
                 prometheus_linger_s, workers, ray_address, records_kept, records_format, sysfs, procfs,
                 env_interval_s, idle_s, telemetry_urls, record_environment) -> None:
    """Steady load for hours: errors by kind, error-free time and throughput drift, checkpointed as it goes."""
    from ...cli.env import machine_config
    from ...cli.live import serving_live_metrics
    from ...cli.modes import base_config, mode_level_runner, mode_out_dir, run_mode
    from ...cli.workers import resolve_workers
    from ...output.progress import SoakStatus
    from ...run.config import SoakSettings
    from ...run.soak import run_soak
    from ...run.state import Run
    from ...run.workers.policy import check_one_target

    slo = build_slo(slo_text, attainment, stream=stream, several_processes=workers != 1 or ray_address is not None)
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls,
                       api=api, model=model, api_key=api_key,
                       transport=transport, insecure=insecure,
                       request=request,
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
    out_dir = mode_out_dir(output, force, "soak")
    err = console(stderr=True)
    if records_format == "parquet":
        columnar.schema()  # pyarrow is there, or one line saying how to get it, before any request

    with serving_live_metrics(prometheus_port, prometheus_host, prometheus_linger_s, (concurrency,), err,
                              slo) as live:
        async def main(checkpoint) -> None:
            with SoakStatus(err, duration_s, log_every_s=checkpoint_interval_s) as status:
                obs = live.observe(status) if live else status
                async with mode_level_runner(run, out_dir, obs) as runner:
                    await run_soak(run, obs, source, settings, runner)

        run_mode(run, out_dir, main, err, records_kept, records_format, checkpoint_every_s=checkpoint_interval_s)

