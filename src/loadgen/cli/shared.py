"""Options every load-sending command shares (sweep, prefill, depth, soak), defined once.

Because `loadgen run` reads a scenario key with the very option that reads its flag, defining an
option here defines it for the command line and the scenario files of every mode at once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import click
from rich.console import Console

from ..core.errors import ConfigError
from ..core.settings import RequestSettings
from ..output.layout import FORMATS
from ..run.prompts import DEFAULT_FIELD, PromptSource, read_dataset, read_text_file, sample_prompts
from .options import LENGTH, PORTS
from .settings import settings_options


def _apply(f: Callable, options: list[Callable]) -> Callable:
    for option in reversed(options):
        f = option(f)
    return f


def target_options(f: Callable) -> Callable:
    """--ports, --host, --url, --label; --api, --model, --api-key; --transport, --insecure; --server-url."""
    from ..client.registry import TRANSPORT_NAMES

    return _apply(f, [
        click.option("--ports", type=PORTS, help="Comma-separated ports of targets on --host, e.g. 8080,8081."),
        click.option("--host", default="127.0.0.1", show_default=True, help="Host for --ports."),
        click.option("--url", "urls", multiple=True,
                     help="A target's base URL (repeatable), e.g. http://127.0.0.1:8080, or behind a gateway "
                          "https://gw.example/llama/v1?api-version=1."),
        click.option("--label", "labels", multiple=True,
                     help="Names for the targets, comma-separated in target order, e.g. a,b [default: the model "
                          "file's name, plus @port when two targets share it]."),
        click.option("--api", default="llamacpp", show_default=True,
                     help="Server API: llamacpp (POST /completion), completions (POST /v1/completions), "
                          "chat (POST /v1/chat/completions), responses (POST /v1/responses), messages "
                          "(POST /v1/messages); embeddings (POST /v1/embeddings) and rerank (POST /v1/rerank) "
                          "answer texts without generating, checked under load."),
        click.option("--model", help="Model name for the OpenAI and Anthropic APIs [default: the first id of the server's "
                                     "/v1/models]."),
        click.option("--api-key", envvar="LOADGEN_API_KEY", show_envvar=True,
                     help="Sent as 'Authorization: Bearer KEY' (prefer the environment variable: a flag shows "
                          "in ps)."),
        click.option("--transport", type=click.Choice(TRANSPORT_NAMES), default="fast", show_default=True,
                     help="HTTP client: fast (asyncio + httptools) or aiohttp (also used behind an HTTP proxy)."),
        click.option("--insecure", is_flag=True,
                     help="Do not verify https targets' TLS certificates (self-signed ones)."),
        click.option("--server-url", "server_urls", multiple=True,
                     help="Behind a gateway: the server's own base URL per target, in order (comma list or "
                          "repeated; empty for none), for /props, /slots, /metrics and /tokenize."),
    ])


format_option = click.option(
    "--format", "output_format", type=click.Choice(FORMATS), default="table", show_default=True,
    help="The tables drawn for a terminal, or as json, csv or markdown on stdout (nothing else goes there).")


def prompt_source_options(f: Callable) -> Callable:
    """--prompt, --prompt-file, --dataset and how it is read and sampled."""
    return _apply(f, [
        click.option("--prompt", help="Prompt text (a salt of 16 random digits is put in front of it per request)."),
        click.option("--prompt-file", type=click.Path(dir_okay=False), help="Read the prompt text from this UTF-8 file."),
        click.option("--dataset", type=click.Path(dir_okay=False), help="Prompts from a JSONL file (one object per line) or a ShareGPT JSON file; "
                                       "request i uses prompt i mod their count."),
        click.option("--dataset-field", default=DEFAULT_FIELD, show_default=True,
                     help="The field of each dataset object that holds the prompt (dotted for nested: input.text); "
                          "ShareGPT conversations give their first human turn."),
        click.option("--dataset-samples", type=click.IntRange(min=1),
                     help="Draw this many prompts from --dataset [default: all of them]."),
        click.option("--dataset-seed", type=int, default=0, show_default=True,
                     help="Seed of the draw from --dataset (and of synthetic text): the same seed, the same "
                          "prompts in the same order."),
    ])


def length_options(f: Callable) -> Callable:
    """A run's prompt and answer lengths, fixed or drawn per request (docs/workloads.md), for every
    kind that sends a workload (sweep, capacity); read with cli/sweep.py's `sweep_lengths`."""
    return _apply(f, [
        click.option("--prompt-tokens", type=LENGTH,
                     help="Cut every prompt to exactly this many tokens for each server (with its /tokenize), "
                          "from the prompt source or synthetic text; or a distribution drawn per request: "
                          "uniform:64:256, normal:200,50,min=32,max=512, lognormal:MEAN,SD[,max=N], "
                          "file:lengths.txt (docs/workloads.md)."),
        click.option("--n-predict", type=LENGTH, default="96", show_default=True,
                     help="Tokens to generate; or a distribution drawn per request, as --prompt-tokens."),
        click.option("--dataset-answer-field", help="With --n-predict dataset: the field of each --dataset entry "
                                                    "that holds its answer, a token count or the text [default: a "
                                                    "ShareGPT conversation's first answer turn]."),
        click.option("--workload-seed", type=int, default=0, show_default=True,
                     help="Seed of the drawn lengths: the same seed, the same lengths in the same order on every "
                          "target."),
    ])


def recording_options(f: Callable) -> Callable:
    """Where a run is recorded: --output and --force (the recording group, still declared by hand)."""
    return _apply(f, [
        click.option("--output", type=click.Path(file_okay=False),
                     help="Results directory [default: results/<UTC time>-<command>]."),
        click.option("--force", is_flag=True, help="Overwrite a results directory that already holds a run."),
    ])


def request_options(f: Callable) -> Callable:
    """Sampling and timeouts, core/settings.py `RequestSettings`, handed to the command as ONE argument
    `request`; and where the results go (`output`, `force`: recording_options)."""
    return settings_options(RequestSettings, "request")(recording_options(f))


def prompt_source(prompt: str | None, prompt_file: str | None, dataset: str | None, dataset_field: str,
                  dataset_samples: int | None, dataset_seed: int) -> PromptSource:
    """The run's texts: --prompt, --prompt-file or --dataset (one of them), else none (synthetic)."""
    given = [name for name, v in (("--prompt", prompt), ("--prompt-file", prompt_file), ("--dataset", dataset))
             if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give {' or '.join(given)}, not {'both' if len(given) == 2 else 'all three'}")
    if dataset is None and (dataset_samples is not None or dataset_field != DEFAULT_FIELD):
        raise ConfigError("--dataset-field and --dataset-samples need --dataset")
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


CHECK_ONLY = "loadgen.check_only"  # ctx.meta key set by `loadgen run FILE --check`


def checking_only() -> bool:
    """True under `loadgen run FILE --check`. A mode's command asks this once it has applied every
    rule of its flags (its config is built) and stops there, before it makes a results directory or
    sends a request: so a check and a run apply one rule set, the command's own."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(CHECK_ONLY))


def describe(source: PromptSource) -> str:
    return "synthetic" if source.synthetic else f"{len(source.texts)} text(s)"


PIPED_WIDTH = 120  # columns of output piped into a file or CI log when COLUMNS does not say


def console(stderr: bool = False) -> Console:
    """A console as wide as COLUMNS says, else the terminal, else (piped) PIPED_WIDTH."""
    stream = sys.stderr if stderr else sys.stdout
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else None
    return Console(stderr=stderr, width=width or (None if stream.isatty() else PIPED_WIDTH))


def _history_path(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:  # through the environment, so a run's own child runs (ab, grid) keep the same store
        os.environ["LOADGEN_HISTORY"] = value


def _no_history(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        os.environ["LOADGEN_HISTORY"] = "off"


def history_options(f: Callable) -> Callable:
    """--history PATH and --no-history: where the run is recorded for `loadgen history` (docs/history.md)."""
    return _apply(f, [
        click.option("--history", "history_path", metavar="PATH|URL", callback=_history_path, expose_value=False,
                     help="The history store this run is added to: a SQLite file, or postgresql://... "
                          "(default $LOADGEN_HISTORY, else $XDG_DATA_HOME/loadgen/history.sqlite)."),
        click.option("--no-history", is_flag=True, callback=_no_history, expose_value=False,
                     help="Do not add this run to the history store."),
    ])


def records_options(f: Callable) -> Callable:
    """--records and --records-format: which request records a run keeps, and in which file format."""
    from ..core.recordsink import RECORDS_FORMATS, RECORDS_KEPT

    return _apply(f, [
        click.option("--records", "records_kept", type=click.Choice(RECORDS_KEPT), default="all", show_default=True,
                     help="Which request records requests.jsonl keeps (errors: failed requests only); the "
                          "summaries and histograms cover every request either way."),
        click.option("--records-format", type=click.Choice(RECORDS_FORMATS), default="jsonl", show_default=True,
                     help="requests.jsonl (JSON lines, readable after a crash) or requests.parquet (compact "
                          "columns for big runs; needs pip install 'loadgen[parquet]')."),
    ])
