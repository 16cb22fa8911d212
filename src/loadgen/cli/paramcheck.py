"""`loadgen paramcheck --direct URL --via URL`: does a gateway pass the request's parameters to the server?

Thin: the canaries are run/paramcheck.py, the verdict rule analysis/paramcheck_verdict.py, the table
output/paramcheck_table.py. Exit 0 when every checked parameter was honoured or cannot be told, 1 when
one was dropped or altered (or a canary got no usable answer), 2 on bad input (a via URL that does
not lead to the direct server included).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..analysis.paramcheck_verdict import DEFAULT_PARAMS, KNOWN_PARAMS, exit_code
from ..core.baseurl import BaseUrl
from ..core.errors import EXIT_FAILED, ConfigError, ResultsError
from ..output.files import write_files
from ..output.paramcheck_table import FILE, paramcheck_file, print_paramcheck
from .help import command
from .shared import console


@command("paramcheck")
@click.option("--direct", required=True, help="The server's own base URL, e.g. http://127.0.0.1:8080.")
@click.option("--via", required=True, help="The gateway's base URL for that server, e.g. https://gw.example/llama/v1.")
@click.option("--api", default="chat", show_default=True, help="llamacpp, completions, chat, responses or messages.")
@click.option("--params", help=f"Parameters to check, comma-separated [default: {','.join(DEFAULT_PARAMS)}; "
                               f"also: {','.join(p for p in KNOWN_PARAMS if p not in DEFAULT_PARAMS)}].")
@click.option("--model", help="Model name for the OpenAI APIs [default: the direct server's first /v1/models id].")
@click.option("--api-key", envvar="LOADGEN_API_KEY", show_envvar=True, help="Sent as 'Authorization: Bearer KEY'.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=120, show_default=True,
              help="Seconds for each request.")
@click.option("--insecure", is_flag=True, help="Do not verify https certificates.")
@click.option("--output", type=click.Path(file_okay=False),
              help="Results folder [default: results/<UTC time>-paramcheck].")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds a paramcheck.")
def paramcheck_command(direct, via, api, params, model, api_key, timeout_s, insecure, output, force) -> None:
    """Send canary requests direct and through a gateway; say per parameter honoured, dropped, altered
    or cannot tell."""
    from ..client.canary import CanaryError
    from ..results.writer import command_line, default_dir, utc_now
    from ..run.config import check_api, normalize_url
    from ..run.paramcheck import run_gateway_check

    direct, via = normalize_url(direct, "--direct"), normalize_url(via, "--via")
    check_api(api, model, api_key)
    chosen = parse_params(params)
    out_dir = Path(output) if output else default_dir(Path("results"), "paramcheck")
    if (out_dir / FILE).exists() and not force:
        raise ResultsError(f"{out_dir} already holds a paramcheck; choose another --output or add --force")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    err = console(stderr=True)
    try:
        result = run_gateway_check(direct, via, api, chosen, model=model, headers=headers, timeout_s=timeout_s,
                                   insecure=insecure)
    except CanaryError as exc:
        err.print(f"loadgen: error: {exc}", style="red", highlight=False, markup=False)
        sys.exit(EXIT_FAILED)
    doc = {"schema": "loadgen.paramcheck", "schema_version": 1, "command": command_line(),
           "finished_utc": utc_now().isoformat(), "direct": _shown(direct), "via": _shown(via),
           **result.to_dict(), "exit_code": exit_code(result.results)}
    print_paramcheck(_shown(via), result.api, result.results, result.metadata, console())
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_files([paramcheck_file(doc)], out_dir)
    except OSError as exc:
        raise ResultsError(f"cannot write to {out_dir} ({exc.strerror}); choose another --output") from None
    err.print(f"results: {out_dir}", highlight=False)
    sys.exit(exit_code(result.results))


def parse_params(text: str | None) -> tuple[str, ...]:
    """--params: known names, no repeats; the default set when not given."""
    if text is None:
        return DEFAULT_PARAMS
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in KNOWN_PARAMS]
    if not text.strip() or unknown:
        raise ConfigError(f"--params: {', '.join(map(repr, unknown)) or 'empty'} not checked; "
                          f"choose from {','.join(KNOWN_PARAMS)}")
    if len(set(names)) != len(names):
        raise ConfigError("--params: a parameter is listed twice")
    return tuple(names)


def _shown(url: str) -> str:
    return BaseUrl.parse(url).text()
