"""`loadgen replay TRACE`: send a recorded trace's requests at their trace times (run/trace_replay.py).

The replay is a sweep of one open-loop level whose schedule is the trace's: it runs, is written
and is read back (analyze, report, export, compare) as any `--rate` sweep is, its level keyed by
the trace's mean rate. The send lag (actual send − trace time) is printed after the run.
Prompts share the trace's blocks on the wire (run/trace_prompts.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ...analysis.slo import DEFAULT_ATTAINMENT
from ...cli.common import results_folder
from ...cli.shared import (
    checking_only,
    format_option,
    history_options,
    records_options,
    request_options,
    target_options,
)
from ...cli.slo import build_slo, slo_options
from ...core.errors import ConfigError
from ...core.rundoc import RunKind
from ...results.reader import load_run
from ...run.trace_replay import plan_replay, read_trace

# A scaled length of 0 is 1; a prompt too short to hold the salt is raised per server to the
# shortest that does (run/trace_prompts.py), counted in run.json and named in the table note.
MIN_PROMPT_TOKENS = 1


@click.command()
@click.argument("trace", type=click.Path(dir_okay=False))
@target_options
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Divide the trace's times by this (2: twice as fast).")
@click.option("--scale-lengths", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="Multiply every prompt and answer length by this, so a trace of a large-context server "
                   "fits a small one.")
@click.option("--max-prompt-tokens", type=click.IntRange(min=MIN_PROMPT_TOKENS),
              help="Clamp the scaled prompt lengths to this.")
@click.option("--max-n-predict", type=click.IntRange(min=1), help="Clamp the scaled answer lengths to this.")
@click.option("--limit", type=click.IntRange(min=1), help="Replay only the trace's first N requests (in time order).")
@click.option("--max-in-flight", type=click.IntRange(min=1),
              help="At most this many requests in flight; late sends still count from their trace time.")
@click.option("--stream/--no-stream", default=False, show_default=True, help="Stream the responses (SSE).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Unrecorded requests per target before the replay.")
@click.option("--ignore-eos/--no-ignore-eos", default=True, show_default=True,
              help="Generate exactly each request's answer length.")
@request_options
@slo_options
@records_options
@history_options
@format_option
def replay_command(trace, ports, host, urls, labels, api, model, api_key, transport, insecure, speed, scale_lengths,
                   max_prompt_tokens, max_n_predict, limit, max_in_flight, stream, warmup, ignore_eos,
                   request, output, force, records_kept, records_format, output_format,
                   server_urls=(), slo_text=None, attainment=DEFAULT_ATTAINMENT) -> None:
    """Replay a trace (Mooncake JSONL, or time/input/output CSV or JSONL) at its own times, open loop."""
    from ...cli.sweep import connections_needed, ensure_open_files, execute_sweep
    from ...client.backends import GenerationParams
    from ...run.config import DEFAULT_PROMPT, SweepConfig, build_targets, check_api

    slo = build_slo(slo_text, attainment, stream=stream)
    plan = plan_replay(read_trace(trace), name=Path(trace).name, speed=speed, scale_lengths=scale_lengths,
                       max_prompt=max_prompt_tokens, max_output=max_n_predict, min_prompt=MIN_PROMPT_TOKENS,
                       limit=limit)
    config = SweepConfig(
        targets=build_targets(host, ports, urls, labels, server_urls), concurrency=(1,), rates=(plan.rate,),
        max_in_flight=max_in_flight, model=model, api_key=api_key, api=check_api(api, model, api_key),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=max(s.n_predict for s in plan.shapes),
                                    **request.generation(), ignore_eos=ignore_eos, stream=stream),
        requests_per_level=len(plan.offsets_ns), warmup=warmup, **request.config(),
        transport=transport, insecure=insecure, replay=plan, slo=slo)
    if len(config.targets) > 1:
        raise ConfigError("replay one target at a time: a trace's times are one server's load")
    ensure_open_files(connections_needed(config), open_loop=True, workers=False)
    if checking_only():
        return
    click.echo(f"replaying {len(plan.shapes)} requests over {plan.offsets_ns[-1] / 1e9:.1f} s "
               f"(mean {plan.rate:g} req/s)", err=True)
    out_dir = results_folder(output, force, "replay")
    code = execute_sweep(config, out_dir, kind=RunKind.REPLAY, output_format=output_format, records=records_kept,
                         records_format=records_format)
    lag = next((lv.schedule_lag_ms for t in load_run(out_dir).targets for lv in t.levels), None)
    if lag:
        click.echo(f"send lag (actual send − trace time): p50 {lag.p50:.1f} ms, p99 {lag.p99:.1f} ms, "
                   f"max {lag.max:.1f} ms", err=True)
    sys.exit(code)
