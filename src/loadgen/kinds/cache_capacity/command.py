"""`loadgen cache-capacity`: how many conversations the prompt cache keeps warm. K conversations,
each with its own exact prefix, take turns one request at a time (a shared-prefix run per K under
k-K/); per K the warm rounds' hit ratio, TTFT and the server's resident memory, the K where reuse
collapses beside the capacity predicted from the slots and the host cache (cache-capacity.json).
Not `loadgen capacity`, the latency-target search (kinds/capacity/command.py). docs/cache.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from ...analysis.cache import CapacityLevel, CapacitySummary, capacity_level, collapse_k, predicted_capacity
from ...cli.common import results_folder
from ...cli.help import command
from ...cli.options import LEVELS
from ...cli.shared import checking_only, format_option, request_options, target_options
from ...cli.shared import console as _console
from ...core.cache_mode import SharedPrefix
from ...core.errors import EXIT_FAILED, EXIT_OK, EXIT_SIGINT, ConfigError
from ...core.rundoc import RunKind
from ...core.server_props import ServerProps
from ...output.cache import cache_capacity_table
from ...output.layout import print_table
from ...results.atomic import write_json
from ...results.reader import load_records, load_run
from ...results.schema import CACHE_CAPACITY_FILE

if TYPE_CHECKING:
    from ...run.config import SweepConfig

# A capacity conversation's own part after its prefix: the salt (18 tokens on SmolLM2) and some text.
OWN_TOKENS = 64


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks only whether the process is there
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _rss_mib(pid: int | None, proc: Path = Path("/proc")) -> float | None:
    """The process's resident memory (VmRSS of /proc/PID/status; without /proc, as on macOS, what
    `ps -o rss= -p PID` says), MiB; None when unreadable."""
    if pid is None:
        return None
    if not (proc / "self").exists():
        return _ps_rss_mib(pid)
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _ps_rss_mib(pid: int) -> float | None:
    try:
        done = subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_ps_rss_mib(done.stdout)


def parse_ps_rss_mib(text: str) -> float | None:
    """`ps -o rss=`'s one number (KiB, on Linux and macOS alike) in MiB; None for anything else."""
    fields = text.split()
    return int(fields[0]) / 1024 if len(fields) == 1 and fields[0].isdigit() else None


@command("cache-capacity")
@target_options
@click.option("--conversation-tokens", type=click.IntRange(min=16), default=512, show_default=True,
              help="Tokens of each conversation's shared part (its history), exact per server.")
@click.option("--k", "ks", type=LEVELS, default="1,2,4,8", show_default=True,
              help="Comma-separated numbers of conversations that take turns, one level each.")
@click.option("--rounds", type=click.IntRange(min=2), default=3, show_default=True,
              help="Turns per conversation per level; the first (cold) round is left out of the figures.")
@click.option("--n-predict", type=click.IntRange(min=1), default=4, show_default=True, help="Tokens per answer.")
@click.option("--server-pid", type=click.IntRange(min=1),
              help="The local server's process id: its resident memory (/proc/PID/status; `ps -o rss` without "
                   "/proc) is read after each K.")
@click.option("--cache-ram-mib", type=click.FloatRange(min=0),
              help="The server's --cache-ram (MiB; 0: off), for the predicted capacity.")
@click.option("--bytes-per-token", type=click.FloatRange(min=0, min_open=True),
              help="KV bytes per token (`loadgen kv MODEL`), for the predicted capacity's host-cache share.")
@click.option("--cache-idle-slots/--no-cache-idle-slots", default=True, show_default=True,
              help="Whether the server saves idle slots to its prompt cache (its default), for the prediction.")
@click.option("--kv-unified", is_flag=True,
              help="The server shares one KV buffer among its slots (its default without --parallel), for the prediction.")
@request_options
@format_option
def cache_capacity_command(ports, host, urls, labels, api, model, api_key, transport, insecure, conversation_tokens,
                           ks, rounds, n_predict, server_pid, cache_ram_mib, bytes_per_token, cache_idle_slots,
                           kv_unified, request, output, force, output_format, server_urls=()) -> None:
    """How many conversations the prompt cache keeps warm: K round-robin, K raised level by level."""
    from ...cli.sweep import execute_sweep
    from ...client.backends import GenerationParams
    from ...results.writer import prepare_dir
    from ...run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api

    targets = build_targets(host, ports, urls, labels, server_urls)
    if len(targets) != 1:
        raise ConfigError("cache-capacity measures one server at a time: give one --url or --ports")
    if server_pid is not None and not _process_exists(server_pid):
        raise ConfigError(f"--server-pid {server_pid}: no such process (give the server's own process id)")
    if checking_only():
        return
    out_dir = results_folder(output, force, "cache-capacity")
    err = _console(stderr=True)

    def k_config(k: int) -> SweepConfig:
        # K conversations, each its own exact prefix, one request at a time in turn (i mod K).
        return SweepConfig(
            targets=targets, concurrency=(1,), model=model, api_key=api_key, api=check_api(api, model, api_key),
            generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict,
                                        ignore_eos=True, **request.generation(), stream=True),
            requests_per_level=k * rounds, warmup=0, **request.config(),
            transport=transport, insecure=insecure,
            shared_prefix=SharedPrefix(conversation_tokens, k, conversation_tokens + OWN_TOKENS, True))

    levels: list[CapacityLevel] = []
    server, code = None, EXIT_OK
    for k in sorted(set(ks)):  # K raised level by level, whatever the order given
        sub = prepare_dir(out_dir / f"k-{k}", True)
        err.print(f"K = {k}: {k} conversations of {conversation_tokens} tokens, {rounds} rounds", highlight=False)
        try:
            code = execute_sweep(k_config(k), sub, _console(stderr=True), kind=RunKind.CACHE_CAPACITY, histograms=False,
                                 output_format=output_format)
        except KeyboardInterrupt:  # between two Ks, outside a run's own handling
            code = EXIT_SIGINT
        if code != EXIT_OK:  # interrupted, or the server went down: the finished Ks are kept
            err.print(f"stopped during K = {k}: cache-capacity.json and the table hold the "
                      f"{len(levels)} finished K(s) only, marked incomplete", highlight=False, style="yellow")
            break
        doc = load_run(sub)
        server = doc.targets[0].server if doc.targets else server
        levels.append(capacity_level(k, load_records(sub), _rss_mib(server_pid)))
    slots = (server.total_slots if server is not None else None) or 1
    n_ctx = ServerProps.of(server.props if server is not None else None).n_ctx
    predicted = predicted_capacity(slots, n_ctx, conversation_tokens + OWN_TOKENS,
                                   n_predict, cache_ram_mib, bytes_per_token, cache_idle_slots, kv_unified,
                                   shared_tokens=conversation_tokens + 1)  # + BOS
    summary = CapacitySummary(conversation_tokens + OWN_TOKENS, rounds, slots, cache_ram_mib, bytes_per_token,
                              cache_idle_slots, kv_unified, predicted, collapse_k(levels), levels,
                              complete=code == EXIT_OK)
    write_json(out_dir / CACHE_CAPACITY_FILE, summary.to_dict())
    print_table(_console(), cache_capacity_table(summary))
    err.print(f"results: {out_dir}", highlight=False)
    sys.exit(code if code != EXIT_OK else _refuse_empty_ks(levels, err))


def _refuse_empty_ks(levels: list[CapacityLevel], err: Console) -> int:
    """EXIT_FAILED, said in one line, when a K had no successful warm request; else EXIT_OK."""
    empty = [str(lv.k) for lv in levels if lv.warm_requests == 0]
    if not empty:
        return EXIT_OK
    err.print(f"error: no warm request succeeded at K = {', '.join(empty)}: no figures there "
              "(see the errors above)", highlight=False, style="red")
    return EXIT_FAILED
