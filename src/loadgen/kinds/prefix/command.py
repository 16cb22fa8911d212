"""`loadgen prefix`: groups of requests sharing an exact system prompt, cache on (command.py); the
requests are run/shared_prefix.py's, the figures analysis/cache.py's. docs/cache.md."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...analysis.slo import DEFAULT_ATTAINMENT
from ...cli.help import command
from ...cli.options import LEVELS
from ...cli.shared import (
    checking_only,
    format_option,
    history_options,
    records_options,
    request_options,
    target_options,
)
from ...cli.slo import build_slo, slo_options
from ...core.cache_mode import SharedPrefix
from ...core.errors import EXIT_OK, ConfigError
from ...core.rundoc import RunKind


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
                   prompt_tokens, concurrency, requests_per_level, n_predict, cache_prompt, warmup,
                   request, output, force, records_kept, records_format, output_format,
                   server_urls=(), slo_text=None, attainment=DEFAULT_ATTAINMENT) -> None:
    """Groups of requests sharing an exact system prompt, cache on: hit ratio, TTFT of hits vs misses."""
    from ...cli.sweep import ensure_open_files, execute_sweep, refuse_empty_levels
    from ...client.backends import GenerationParams
    from ...results.reader import load_run
    from ...results.writer import default_dir, prepare_dir
    from ...run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api

    if prompt_tokens is not None and prompt_tokens <= prefix_tokens:
        raise ConfigError(f"--prompt-tokens {prompt_tokens} must be more than --prefix-tokens {prefix_tokens} "
                          "(the salt and each request's own text follow the prefix)")
    mode = SharedPrefix(prefix_tokens, groups, prompt_tokens or 0, cache_prompt)
    config = SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=concurrency, model=model,
        api_key=api_key, api=check_api(api, model, api_key),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict,
                                    ignore_eos=True, **request.generation(), stream=True),
        requests_per_level=requests_per_level, warmup=warmup, **request.config(),
        transport=transport, insecure=insecure, shared_prefix=mode,
        slo=build_slo(slo_text, attainment, stream=True))  # streamed: every target can be judged
    ensure_open_files(max(concurrency))
    if checking_only():
        return
    out_dir = prepare_dir(Path(output) if output else default_dir(Path("results"), "prefix"), force)
    code = execute_sweep(config, out_dir, kind=RunKind.PREFIX, output_format=output_format, records=records_kept,
                         records_format=records_format)
    sys.exit(refuse_empty_levels(load_run(out_dir)) if code == EXIT_OK else code)

