"""`loadgen chat`: multi-turn conversations that re-send their real history (command.py), run by
run/multiturn.py on the one client; per-turn tables in output/cache.py. docs/cache.md."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ...analysis.slo import DEFAULT_ATTAINMENT
from ...cli.env import machine_options
from ...cli.help import command
from ...cli.shared import (
    checking_only,
    format_option,
    history_options,
    records_options,
    request_options,
    target_options,
)
from ...cli.shared import console as _console
from ...cli.slo import build_slo, slo_options
from ...client.backends import CONVERSATION_APIS
from ...core.cache_mode import MultiTurn
from ...core.errors import EXIT_FAILED, EXIT_OK, ConfigError, UserError
from ...core.rundoc import RunDocument, RunKind

if TYPE_CHECKING:
    from ...run.config import SweepConfig

CHAT_APIS = CONVERSATION_APIS  # the APIs whose backends send a conversation's turns (client/backends)


@command()
@target_options
@click.option("--users", type=click.IntRange(min=1, max=1024), default=4, show_default=True,
              help="Conversations held at once.")
@click.option("--turns", type=click.IntRange(min=1, max=1000), default=5, show_default=True,
              help="Turns per conversation; each re-sends the whole history plus a new message.")
@click.option("--message-tokens", type=click.IntRange(min=4), default=64, show_default=True,
              help="About this many tokens per new user message.")
@click.option("--think", "think_s", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Seconds a user waits after an answer before the next message.")
@click.option("--think-jitter", "think_jitter_s", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Plus a uniform draw in [0, this) seconds per pause (seeded by --conversation-seed).")
@click.option("--conversation-seed", type=int, default=0, show_default=True, help="Seed of the think-time draws.")
@click.option("--pin-slots", is_flag=True, help="User u always asks for slot u mod the server's slots (id_slot).")
@click.option("--n-predict", type=click.IntRange(min=1), default=32, show_default=True,
              help="Tokens each answer has (the answer then joins the history).")
@click.option("--cache/--no-cache", "cache_prompt", default=True, show_default=True,
              help="Send cache_prompt true (reuse the history) or false (a run to read beside the cached one).")
@machine_options
@request_options
@slo_options
@records_options
@history_options
@format_option
def chat_command(ports, host, urls, labels, api, model, api_key, transport, insecure, users, turns, message_tokens,
                 think_s, think_jitter_s, conversation_seed, pin_slots, n_predict, cache_prompt, sysfs, procfs,
                 env_interval_s, idle_s, telemetry_urls, record_environment,
                 request, output, force, records_kept, records_format, output_format,
                 server_urls=(), slo_text=None, attainment=DEFAULT_ATTAINMENT) -> None:
    """Multi-turn conversations that re-send their real history: prompt_n, cache_n, TTFT per turn."""
    from ...cli.env import machine_config
    from ...cli.sweep import ensure_open_files
    from ...client.backends import GenerationParams
    from ...results.writer import default_dir, prepare_dir
    from ...run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api

    if api not in CHAT_APIS:
        raise ConfigError(f"loadgen chat speaks llama-server's /completion (--api llamacpp) or /v1/chat/completions "
                          f"(--api chat), not --api {api}")
    mode = MultiTurn(users, turns, message_tokens, think_s, think_jitter_s, pin_slots, cache_prompt, conversation_seed)
    config = SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=(users,), model=model,
        api_key=api_key, api=check_api(api, model, api_key),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict,
                                    ignore_eos=True, **request.generation(), stream=True, cache_prompt=cache_prompt),
        requests_per_level=users * turns, warmup=0, **request.config(),
        transport=transport, insecure=insecure, multi_turn=mode, slo=build_slo(slo_text, attainment, stream=True),
        machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls, record_environment))
    ensure_open_files(users)
    if checking_only():
        return
    out_dir = prepare_dir(Path(output) if output else default_dir(Path("results"), "chat"), force)
    sys.exit(execute_chat(config, mode, out_dir, output_format, records_kept, records_format))


def execute_chat(config: SweepConfig, mode: MultiTurn, out_dir: Path, output_format: str = "table",
                 records: str = "all", records_format: str = "jsonl") -> int:
    """Run the conversations, print the run's tables and the per-turn table, write the results."""
    from ...cli.sweep import refuse_empty_levels, run_exit_code
    from ...output.progress import ProgressObserver
    from ...output.tables import print_run
    from ...results.writer import RunFiles
    from ...run.multiturn import run_multiturn
    from ...run.session import FinalWriteError, execute
    from ...run.state import Run

    console, err = _console(), _console(stderr=True)
    run = Run(config, RunKind.CHAT)

    async def main(checkpoint) -> None:
        with ProgressObserver(err, on_level_done=checkpoint) as observer:
            await run_multiturn(run, observer, mode)

    try:
        execution = execute(run, RunFiles(out_dir, records, records_format), main, err=err)
    except FinalWriteError as exc:
        raise UserError(str(exc), EXIT_FAILED) from None
    doc = execution.doc
    # the per-turn tables from the records as they were kept (`analyze` reads them back from the folder)
    kept = [r for t in run.targets for lv in t.levels for r in lv.records]
    print_run(doc, console, err, output_format, live=True, records=kept)
    err.print(f"results: {out_dir}", highlight=False)
    code = run_exit_code(execution)
    return code if code != EXIT_OK else refuse_empty_levels(RunDocument.of(doc))

