"""`loadgen prefill`, `loadgen depth` and `loadgen soak`: the field reports' other experiments.

Thin: options are read and checked here, the measuring is in prefill.py, depth.py, soak.py and
modes.py, the figures in their pure summary functions, the tables in report.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..backends import API_NAMES, GenerationParams
from ..depth import SKIP_HINT
from ..config import DEFAULT_PROMPT, ConfigError, SweepConfig, build_targets, check_api
from ..modes import ModeRun, run_steps
from ..options import DEPTHS, DURATION, PORTS, PROMPT_LENGTHS
from ..progress import SoakStatus, StepProgress
from ..prompts import DEFAULT_FIELD, PromptSource, read_dataset, read_text_file, sample_prompts
from ..report import depth_table, error_lines, prefill_table, soak_table
from ..results import default_dir, prepare_dir
from ..soak import run_soak
from .execute import Execution, FinalWriteError, execute

EXIT_OK, EXIT_FAILED = 0, 1


def target_options(f: Callable) -> Callable:
    for option in reversed([
        click.option("--ports", type=PORTS, help="Comma-separated ports of targets on --host, e.g. 8080,8081."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Host for --ports."),
        click.option("--url", "urls", multiple=True, help="A target's base URL (repeatable)."),
        click.option("--label", "labels", multiple=True, help="A name per target, in order "
                                                               "(default: the server's model alias)."),
        click.option("--api", default="llamacpp", show_default=True, help=f"Server API: {', '.join(API_NAMES)}."),
    ]):
        f = option(f)
    return f


def prompt_source_options(f: Callable) -> Callable:
    for option in reversed([
        click.option("--prompt", help="Prompt text (a uuid salt is put in front of it per request)."),
        click.option("--prompt-file", help="Read the prompt text from this UTF-8 file."),
        click.option("--dataset", help="Prompts from a JSONL file (one object per line) or a ShareGPT JSON file."),
        click.option("--dataset-field", default=DEFAULT_FIELD, show_default=True,
                     help="The field of each JSONL object that holds the prompt (dotted for nested: input.text)."),
        click.option("--dataset-samples", type=click.IntRange(min=1),
                     help="Draw this many prompts from --dataset [default: all of them]."),
        click.option("--dataset-seed", type=int, default=0, show_default=True,
                     help="Seed of the draw from --dataset: the same seed, the same prompts in the same order."),
    ]):
        f = option(f)
    return f


def request_options(f: Callable) -> Callable:
    for option in reversed([
        click.option("--temperature", type=click.FloatRange(min=0), default=0.7, show_default=True),
        click.option("--seed", type=int, help="Sampling seed sent with every request."),
        click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=600,
                     show_default=True, help="Seconds before a request counts as timed out."),
        click.option("--wait-ready", "wait_ready_s", type=click.FloatRange(min=0), default=60, show_default=True,
                     help="Seconds to wait for a server that is still loading its model."),
        click.option("--output", type=click.Path(file_okay=False), help="Results directory "
                                                                         "[default: results/<UTC time>-<command>]."),
        click.option("--force", is_flag=True, help="Overwrite a results directory that already holds a run."),
    ]):
        f = option(f)
    return f


def prompt_source(prompt: str | None, prompt_file: str | None, dataset: str | None, dataset_field: str,
                  dataset_samples: int | None, dataset_seed: int) -> PromptSource:
    """The run's texts: --prompt, --prompt-file or --dataset (one of them), else none (synthetic)."""
    given = [name for name, v in (("--prompt", prompt), ("--prompt-file", prompt_file), ("--dataset", dataset))
             if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of {', '.join(given)}, not several")
    if prompt is not None:
        if not prompt.strip():
            raise ConfigError("the prompt is empty")
        return PromptSource((prompt,), dataset_seed)
    if prompt_file is not None:
        return PromptSource((read_text_file(prompt_file),), dataset_seed)
    if dataset is not None:
        return PromptSource(tuple(sample_prompts(read_dataset(dataset, dataset_field), dataset_samples,
                                                 dataset_seed)), dataset_seed)
    return PromptSource(seed=dataset_seed)


def base_config(*, ports: tuple[int, ...] | None, host: str, urls: tuple[str, ...], labels: tuple[str, ...],
                api: str, temperature: float, seed: int | None, timeout_s: float, wait_ready_s: float, warmup: int,
                n_predict: int, ignore_eos: bool = True, concurrency: int = 1,
                probe_interval_s: float = 0.25) -> SweepConfig:
    """Targets, API and request settings as a sweep would have them (one level)."""
    return SweepConfig(
        targets=build_targets(host, ",".join(map(str, ports)) if ports else None, urls, labels),
        concurrency=(concurrency,),
        generation=GenerationParams(prompt=DEFAULT_PROMPT, n_predict=n_predict, temperature=temperature,
                                    ignore_eos=ignore_eos, seed=seed),
        api=check_api(api), warmup=warmup, timeout_s=timeout_s, wait_ready_s=wait_ready_s,
        probe_interval_s=probe_interval_s)


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 180)


def print_mode(doc: dict[str, Any], console: Console, err: Console) -> None:
    """The table of a prefill, depth or soak run document (after the run, and from `analyze`)."""
    kind = doc.get("kind")
    if kind == "prefill":
        console.print(prefill_table(doc))
    elif kind == "depth":
        console.print(depth_table(doc))
    elif kind == "soak":
        console.print(soak_table(doc))
    sections = [t.get(kind) for t in doc["targets"] if kind in ("prefill", "depth")]
    if any("per-slot n_ctx" in (r.get("skipped") or "") for s in sections if s for r in s["rows"]):
        console.print(SKIP_HINT, style="dim", highlight=False, markup=False, soft_wrap=True)
    for line in error_lines(doc):
        err.print(line, style="red", highlight=False, markup=False, soft_wrap=True)


def _finish(execution: Execution, out_dir: Path, err: Console) -> int:
    doc = execution.doc
    print_mode(doc, _console(), err)
    err.print(f"results: {out_dir}", highlight=False)
    if execution.exit_code_for_signal is not None:
        return execution.exit_code_for_signal
    if any(t["error"] for t in doc["targets"]):
        return EXIT_FAILED
    return EXIT_OK


def _run(run: ModeRun, out_dir: Path, main: Callable, err: Console) -> None:
    try:
        execution = execute(run, out_dir, main, kind=run.kind, err=err)
    except FinalWriteError as exc:
        err.print(f"loadgen: error: {exc}", style="red", highlight=False, markup=False)
        sys.exit(EXIT_FAILED)
    sys.exit(_finish(execution, out_dir, err))


def _out_dir(output: str | None, force: bool, kind: str) -> Path:
    return prepare_dir(Path(output) if output else default_dir(Path("results"), kind), force)


@click.command("prefill")
@target_options
@click.option("--prompt-tokens", type=PROMPT_LENGTHS, default="512,2048,8192", show_default=True,
              help="Prompt lengths in tokens, each cut exactly for each server with its /tokenize.")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Requests per server and length; figures are mean ± sd over them.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Unrecorded requests per target first, with the shortest prompt.")
@prompt_source_options
@request_options
def prefill_command(ports, host, urls, labels, api, prompt_tokens, repeat, warmup, prompt, prompt_file, dataset,
                    dataset_field, dataset_samples, dataset_seed, temperature, seed, timeout_s, wait_ready_s,
                    output, force) -> None:
    """Prefill speed per prompt length: prompt_n, prompt_ms, prompt tok/s and client TTFT per server."""
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, api=api, temperature=temperature,
                       seed=seed, timeout_s=timeout_s, wait_ready_s=wait_ready_s, warmup=warmup, n_predict=1)
    run = ModeRun("prefill", base, {"prompt_tokens": list(prompt_tokens), "repeat": repeat, "n_predict": 1,
                                    "concurrency": [1], "prompt_source": _describe(source)})
    out_dir = _out_dir(output, force, "prefill")
    err = _console(stderr=True)

    async def main(checkpoint) -> None:
        with StepProgress(err, "prefill", on_step_done=checkpoint) as obs:
            await run_steps(run, obs, source, prompt_tokens, n_predict=1, repeat=repeat, salt_only_below=False)

    _run(run, out_dir, main, err)


@click.command("depth")
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
def depth_command(ports, host, urls, labels, api, depths, n_predict, repeat, warmup, prompt, prompt_file, dataset,
                  dataset_field, dataset_samples, dataset_seed, temperature, seed, timeout_s, wait_ready_s,
                  output, force) -> None:
    """Decode speed after a context filled to each depth, and its drop against depth 0 (llama-bench -d)."""
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, api=api, temperature=temperature,
                       seed=seed, timeout_s=timeout_s, wait_ready_s=wait_ready_s, warmup=warmup,
                       n_predict=n_predict)
    run = ModeRun("depth", base, {"depths": list(depths), "repeat": repeat, "n_predict": n_predict,
                                  "concurrency": [1], "prompt_source": _describe(source)})
    out_dir = _out_dir(output, force, "depth")
    err = _console(stderr=True)

    async def main(checkpoint) -> None:
        with StepProgress(err, "depth", on_step_done=checkpoint) as obs:
            await run_steps(run, obs, source, depths, n_predict=n_predict, repeat=repeat, salt_only_below=True)

    _run(run, out_dir, main, err)


@click.command("soak")
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
@click.option("--prompt-tokens", type=click.IntRange(min=1),
              help="Cut the prompt to exactly this many tokens for each server.")
@click.option("--warmup", type=click.IntRange(min=0), default=2, show_default=True,
              help="Unrecorded requests per target before the soak starts.")
@click.option("--probe-interval", "probe_interval_s", type=click.FloatRange(min=0.01), default=5, show_default=True,
              help="Seconds between scrapes of each server's /metrics and /slots.")
@prompt_source_options
@request_options
def soak_command(ports, host, urls, labels, api, concurrency, duration_s, checkpoint_interval_s, n_predict,
                 ignore_eos, prompt_tokens, warmup, probe_interval_s, prompt, prompt_file, dataset, dataset_field,
                 dataset_samples, dataset_seed, temperature, seed, timeout_s, wait_ready_s, output, force) -> None:
    """Steady load for hours: errors by kind, error-free time and throughput drift, checkpointed as it goes."""
    source = prompt_source(prompt, prompt_file, dataset, dataset_field, dataset_samples, dataset_seed)
    base = base_config(ports=ports, host=host, urls=urls, labels=labels, api=api, temperature=temperature,
                       seed=seed, timeout_s=timeout_s, wait_ready_s=wait_ready_s, warmup=warmup,
                       n_predict=n_predict, ignore_eos=ignore_eos, concurrency=concurrency,
                       probe_interval_s=probe_interval_s)
    if not prompt_tokens and not source.synthetic:
        base = _with_prompt(base, source.texts[0])
    run = ModeRun("soak", base, {"concurrency": [concurrency], "duration_s": duration_s,
                                 "checkpoint_interval_s": checkpoint_interval_s, "prompt_tokens": prompt_tokens,
                                 "probe_interval_s": probe_interval_s, "prompt_source": _describe(source)})
    out_dir = _out_dir(output, force, "soak")
    err = _console(stderr=True)

    async def main(checkpoint) -> None:
        with SoakStatus(err, duration_s, log_every_s=checkpoint_interval_s) as obs:
            await run_soak(run, obs, source, checkpoint)

    _run(run, out_dir, main, err)


def _with_prompt(config: SweepConfig, prompt: str) -> SweepConfig:
    from dataclasses import replace

    return replace(config, generation=replace(config.generation, prompt=prompt))


def _describe(source: PromptSource) -> str:
    return "synthetic" if source.synthetic else f"{len(source.texts)} text(s)"


MODE_COMMANDS = (prefill_command, depth_command, soak_command)
