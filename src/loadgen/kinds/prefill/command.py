"""`loadgen prefill`: prefill speed per prompt length (command.py); the steps run in run/steps.py,
the figures in analysis/prefill.py, its table is output/tables.py `prefill_table` (its view)."""

from __future__ import annotations

import click

from ...cli.env import machine_options
from ...cli.help import command
from ...cli.options import PROMPT_LENGTHS
from ...cli.shared import (
    checking_only,
    console,
    describe,
    prompt_source,
    prompt_source_options,
    request_options,
    target_options,
)
from ...core.rundoc import RunKind


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
                    warmup, prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed,
                    request, output, force, sysfs, procfs, env_interval_s, idle_s,
                    telemetry_urls, record_environment) -> None:
    """Prefill speed per prompt length: prompt_n, prompt_ms, prompt tok/s and client TTFT per server."""
    from ...cli.env import machine_config
    from ...cli.modes import base_config, mode_level_runner, mode_out_dir, run_mode
    from ...output.progress import StepProgress
    from ...run.state import Run
    from ...run.steps import run_steps

    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls,
                       api=api, model=model, api_key=api_key,
                       transport=transport, insecure=insecure,
                       request=request,
                       warmup=warmup, n_predict=1,
                       machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls,
                                              record_environment))
    run = Run(base, RunKind.PREFILL, {"prompt_tokens": list(prompt_tokens), "repeat": repeat, "n_predict": 1,
                                    "concurrency": [1], "prompt_source": describe(source)})
    if checking_only():
        return
    out_dir = mode_out_dir(output, force, "prefill")
    err = console(stderr=True)

    async def main(checkpoint) -> None:
        with StepProgress(err, "prefill", on_step_done=checkpoint) as obs:
            async with mode_level_runner(run, out_dir, obs) as runner:
                await run_steps(run, obs, source, prompt_tokens, n_predict=1, repeat=repeat, salt_only_below=False,
                                runner=runner)

    run_mode(run, out_dir, main, err)

