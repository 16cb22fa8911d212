"""`loadgen depth`: decode speed after a context filled to each depth (command.py); the steps run
in run/steps.py, the figures in analysis/depth.py, its table is output/tables.py `depth_table`."""

from __future__ import annotations

import click

from ...cli.env import machine_options
from ...cli.help import command
from ...cli.options import DEPTHS
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
                  warmup, prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed,
                  request, output, force, sysfs, procfs, env_interval_s, idle_s,
                  telemetry_urls, record_environment) -> None:
    """Decode speed after a context filled to each depth, and its drop against depth 0 (llama-bench -d)."""
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
                       warmup=warmup, n_predict=n_predict,
                       machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls,
                                              record_environment))
    run = Run(base, RunKind.DEPTH, {"depths": list(depths), "repeat": repeat, "n_predict": n_predict,
                                  "concurrency": [1], "prompt_source": describe(source)})
    if checking_only():
        return
    out_dir = mode_out_dir(output, force, "depth")
    err = console(stderr=True)

    async def main(checkpoint) -> None:
        with StepProgress(err, "depth", on_step_done=checkpoint) as obs:
            async with mode_level_runner(run, out_dir, obs) as runner:
                await run_steps(run, obs, source, depths, n_predict=n_predict, repeat=repeat, salt_only_below=True,
                                runner=runner)

    run_mode(run, out_dir, main, err)

