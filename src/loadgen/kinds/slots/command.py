"""`loadgen slots`: save a conversation's slot, make the server forget it, restore it and send the
next turn; per cycle the verdict (restored, or silently re-processed) from turn 2's cache_n and
TTFT against a re-processed control, with save and restore time and the file's size per token,
optionally while other slots decode (--concurrency). A run kind of its own, not a cache-capacity
mode: docs/slots.md says why.
"""

from __future__ import annotations

from pathlib import Path

import click

from ...cli.help import command
from ...cli.options import IntList
from ...cli.shared import checking_only, console, request_options, target_options
from ...core.errors import ConfigError
from ...core.rundoc import RunKind


@command("slots")
@target_options
@click.option("--slot", "slot_ids", type=IntList(0, 4095), default="0", show_default=True,
              help="Comma-separated slot ids the cycles run on (side by side, one cycle at a time on each).")
@click.option("--cycles", type=click.IntRange(min=1), default=3, show_default=True, help="Cycles per slot.")
@click.option("--prompt-tokens", type=click.IntRange(min=16), default=512, show_default=True,
              help="About how many tokens turn 1's message has (its prompt_n is what the server counted).")
@click.option("--forget", type=click.Choice(["erase", "other"]), default="erase", show_default=True,
              help="How the server forgets the slot between save and restore: erase it, or another conversation on it.")
@click.option("--concurrency", type=click.IntRange(min=0), default=0, show_default=True,
              help="Plain requests in flight on the other slots while the cycles run (0: none).")
@click.option("--slot-save-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The server's --slot-save-path, when it is on this machine: each file's size is read there "
                   "(else the server's n_written).")
@click.option("--n-predict", type=click.IntRange(min=1), default=4, show_default=True, help="Tokens per answer.")
@request_options
def slots_command(ports, host, urls, labels, server_urls, api, model, api_key, transport, insecure, slot_ids,
                  cycles, prompt_tokens, forget, concurrency, slot_save_dir, n_predict, request, output, force) -> None:
    """Save a conversation's slot, forget it, restore it: the next turn's cache_n and TTFT, save/restore time."""
    import asyncio
    import dataclasses

    from ...cli.modes import base_config, mode_out_dir, run_mode
    from ...output.progress import ProgressObserver
    from ...run.slots import SlotPlan, preflight, run_slots
    from ...run.state import Run

    if api != "llamacpp":
        raise ConfigError(f"--api {api}: slot actions and id_slot are llama-server's; use --api llamacpp")
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, server_urls=server_urls, api=api,
                       model=model, api_key=api_key, transport=transport, insecure=insecure,
                       request=request,
                       warmup=0, n_predict=n_predict, stream=True)
    if len(base.targets) != 1:
        raise ConfigError("slots measures one server at a time: give one --url or --ports")
    base = dataclasses.replace(base, generation=dataclasses.replace(base.generation, cache_prompt=True))
    plan = SlotPlan(slot_ids, cycles, prompt_tokens, forget, concurrency, slot_save_dir)
    run = Run(base, RunKind.SLOTS, {"slots": list(slot_ids), "cycles": cycles, "prompt_tokens": prompt_tokens,
                                    "forget": forget, "concurrency": concurrency, "n_predict": n_predict})
    if checking_only():
        return
    asyncio.run(preflight(base, plan))  # one line and out before the first cycle: exit 2 or 1
    out_dir = mode_out_dir(output, force, "slots")
    err = console(stderr=True)

    async def main(checkpoint) -> None:
        with ProgressObserver(err, on_level_done=checkpoint) as obs:
            await run_slots(run, obs, plan)

    run_mode(run, out_dir, main, err)
