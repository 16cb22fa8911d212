"""`loadgen wake`: what a request pays that finds the server asleep (llama-server's
--sleep-idle-seconds unloads an idle model): per cycle, requests to the awake server, an idle wait
until /props says is_sleeping, and as many requests at once to the sleeping server; the cold
TTFT against the warm one, with the server's own prefill to show the wait is the reload.
"""

from __future__ import annotations

import click

from ...cli.help import command
from ...cli.shared import checking_only, console, request_options, target_options
from ...core.errors import ConfigError
from ...core.rundoc import RunKind


@command("wake")
@target_options
@click.option("--cycles", type=click.IntRange(min=1), default=3, show_default=True,
              help="Sleep-and-wake cycles: warm requests, the idle wait, cold requests.")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=1, show_default=True,
              help="Requests sent at once, warm and cold (the first cold one wakes the server, the others wait too).")
@click.option("--idle", "idle_s", type=click.FloatRange(min=0, min_open=True), default=30, show_default=True,
              help="Seconds to wait for the server to say is_sleeping after the warm requests (longer than its "
                   "--sleep-idle-seconds).")
@click.option("--n-predict", type=click.IntRange(min=1), default=8, show_default=True, help="Tokens per answer.")
@request_options
def wake_command(ports, host, urls, labels, server_urls, api, model, api_key, transport, insecure, cycles,
                 concurrency, idle_s, n_predict, request, output,
                 force) -> None:
    """A server waking from sleep (--sleep-idle-seconds): what a request that finds it asleep waits."""
    import asyncio

    from ...cli.modes import base_config, mode_out_dir, run_mode
    from ...output.progress import ProgressObserver
    from ...run.state import Run
    from ...run.wake import WakePlan, preflight, run_wake

    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls, api=api,
                       model=model, api_key=api_key, transport=transport, insecure=insecure,
                       request=request, warmup=0, n_predict=n_predict, stream=True, concurrency=concurrency)
    if len(base.targets) != 1:
        raise ConfigError("wake measures one server at a time: give one --url or --ports")
    plan = WakePlan(cycles, concurrency, idle_s)
    run = Run(base, RunKind.WAKE, {"cycles": cycles, "concurrency": concurrency, "idle_s": idle_s,
                                   "n_predict": n_predict})
    if checking_only():
        return
    asyncio.run(preflight(base))  # one line and out before the first cycle: exit 1
    out_dir = mode_out_dir(output, force, "wake")
    err = console(stderr=True)

    async def main(checkpoint) -> None:
        with ProgressObserver(err, on_level_done=checkpoint) as obs:
            await run_wake(run, obs, plan)

    run_mode(run, out_dir, main, err)
