"""Cache-aware runs: `loadgen prefix` (groups sharing a system prompt) and `loadgen chat`
(multi-turn conversations). Both send `cache_prompt: true` (`--no-cache`: false, a run to read beside
the cached one) and say so in run.json's config (`cache_prompt`, `cache`) and above their tables. docs/cache.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..analysis.slo import DEFAULT_ATTAINMENT
from ..client.backends import CONVERSATION_APIS
from ..core.cache_mode import MultiTurn, SharedPrefix
from ..core.errors import EXIT_FAILED, EXIT_OK, ConfigError, UserError
from ..core.rundoc import RunDocument, RunKind
from ..results.reader import load_run
from .common import results_folder
from .env import machine_config, machine_options
from .help import command
from .options import LEVELS
from .shared import (
    checking_only,
    format_option,
    history_options,
    records_options,
    request_options,
    target_options,
)
from .shared import console as _console
from .slo import build_slo, slo_options

if TYPE_CHECKING:
    from ..run.config import SweepConfig


@command()
@target_options
@click.option("--prefix-tokens", type=click.IntRange(min=16), required=True,
              help="Tokens of the system prompt a group's requests share, exact per server (BOS not counted).")
@click.option("--groups", type=click.IntRange(min=1), default=1, show_default=True,
              help="Groups of requests, each with its own prefix; request i is of group i mod groups.")
@click.option("--prompt-tokens", type=click.IntRange(min=1),
              help="Each whole prompt, exact per server: BOS + prefix + salt + the request's own text "
                   "[default: prefix + 64].")
@click.option("--concurrency", "-c", type=LEVELS, default="1", show_default=True,
              help="Comma-separated concurrency levels.")
@click.option("--requests", "requests_per_level", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests per level.")
@click.option("--n-predict", type=click.IntRange(min=1), default=16, show_default=True, help="Tokens to generate.")
@click.option("--cache/--no-cache", "cache_prompt", default=True, show_default=True,
              help="Send cache_prompt true (reuse the shared prefix) or false (the same prompts, computed in full).")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Unrecorded requests per target first (they warm the server, not the levels' prefixes: each level's are new).")
@request_options
@slo_options
@records_options
@history_options
@format_option
def prefix_command(ports, host, urls, labels, api, model, api_key, transport, insecure, prefix_tokens, groups,
                   prompt_tokens, concurrency, requests_per_level, n_predict, cache_prompt, warmup, temperature, seed,
                   timeout_s, wait_ready_s, output, force, records_kept, records_format, output_format,
                   server_urls=(), slo_text=None, attainment=DEFAULT_ATTAINMENT) -> None:
    """Groups of requests sharing an exact system prompt, cache on: hit ratio, TTFT of hits vs misses."""
    from ..client.backends import GenerationParams
    from ..run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api
    from .sweep import ensure_open_files, execute_sweep

    if prompt_tokens is not None and prompt_tokens <= prefix_tokens:
        raise ConfigError(f"--prompt-tokens {prompt_tokens} must be more than --prefix-tokens {prefix_tokens} "
                          "(the salt and each request's own text follow the prefix)")
    mode = SharedPrefix(prefix_tokens, groups, prompt_tokens or 0, cache_prompt)
    config = SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=concurrency, model=model,
        api_key=api_key, api=check_api(api, model, api_key),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict, temperature=temperature,
                                    ignore_eos=True, seed=seed, stream=True),
        requests_per_level=requests_per_level, warmup=warmup, timeout_s=timeout_s, wait_ready_s=wait_ready_s,
        transport=transport, insecure=insecure, shared_prefix=mode,
        slo=build_slo(slo_text, attainment, stream=True))  # streamed: every target can be judged
    ensure_open_files(max(concurrency))
    if checking_only():
        return
    out_dir = results_folder(output, force, "prefix")
    code = execute_sweep(config, out_dir, kind=RunKind.PREFIX, output_format=output_format, records=records_kept,
                         records_format=records_format)
    sys.exit(refuse_empty_levels(load_run(out_dir)) if code == EXIT_OK else code)


def refuse_empty_levels(doc: RunDocument) -> int:
    """EXIT_FAILED, said in one line, when a level had no successful request (its cache figures
    are n/a, not a result); else EXIT_OK."""
    empty = [f"{t.label} at {lv.level:g}" for t in doc.targets for lv in t.levels if lv.requests_ok == 0]
    if not empty:
        return EXIT_OK
    _console(stderr=True).print(f"error: no request succeeded at {', '.join(empty)}: those levels have no cache "
                                "figures (see the errors above)", highlight=False, style="red")
    return EXIT_FAILED


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
                 env_interval_s, idle_s, telemetry_urls, record_environment, temperature, seed,
                 timeout_s, wait_ready_s, output, force, records_kept, records_format, output_format,
                 server_urls=(), slo_text=None, attainment=DEFAULT_ATTAINMENT) -> None:
    """Multi-turn conversations that re-send their real history: prompt_n, cache_n, TTFT per turn."""
    from ..client.backends import GenerationParams
    from ..run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api
    from .sweep import ensure_open_files

    if api not in CHAT_APIS:
        raise ConfigError(f"loadgen chat speaks llama-server's /completion (--api llamacpp) or /v1/chat/completions "
                          f"(--api chat), not --api {api}")
    mode = MultiTurn(users, turns, message_tokens, think_s, think_jitter_s, pin_slots, cache_prompt, conversation_seed)
    config = SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=(users,), model=model,
        api_key=api_key, api=check_api(api, model, api_key),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict, temperature=temperature,
                                    ignore_eos=True, seed=seed, stream=True, cache_prompt=cache_prompt),
        requests_per_level=users * turns, warmup=0, timeout_s=timeout_s, wait_ready_s=wait_ready_s,
        transport=transport, insecure=insecure, multi_turn=mode, slo=build_slo(slo_text, attainment, stream=True),
        machine=machine_config(sysfs, procfs, env_interval_s, idle_s, telemetry_urls, record_environment))
    ensure_open_files(users)
    if checking_only():
        return
    out_dir = results_folder(output, force, "chat")
    sys.exit(execute_chat(config, mode, out_dir, output_format, records_kept, records_format))


def execute_chat(config: SweepConfig, mode: MultiTurn, out_dir: Path, output_format: str = "table",
                 records: str = "all", records_format: str = "jsonl") -> int:
    """Run the conversations, print the run's tables and the per-turn table, write the results."""
    from ..output.progress import ProgressObserver
    from ..output.tables import print_run
    from ..results.writer import RunFiles
    from ..run.multiturn import run_multiturn
    from ..run.session import FinalWriteError, execute
    from ..run.state import Run

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
    if execution.exit_code_for_signal is not None:
        return execution.exit_code_for_signal
    typed = RunDocument.of(doc)
    if any(t.error for t in typed.targets) or not any(t.levels for t in typed.targets):
        return EXIT_FAILED
    return refuse_empty_levels(typed)
