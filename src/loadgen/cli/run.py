"""`loadgen run FILE.toml [--set key=value ...]`: run a scenario file with the command of its mode.

Every key is checked (scenario.py) before the mode's command starts, so a bad file exits 2 naming
FILE:LINE: key: before any request is sent. `--check` runs the mode's command too, which applies its
rules across keys (the same as on the command line) and stops before its first request.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import ConfigError
from ..core.kinds import KINDS
from .scenario import ScenarioError, check_mode, load_scenario, parse_set, resolve
from .shared import CHECK_ONLY

# A scenario's modes: every run kind a file may name (core/kinds.py), grid and tune.
MODES = (*(k.name for k in KINDS.values() if k.scenario), "grid", "tune")


def mode_commands(ctx: click.Context) -> dict[str, click.Command]:
    root = ctx.find_root().command
    assert isinstance(root, click.Group)
    found = {name: root.get_command(ctx, name) for name in MODES}
    return {name: command for name, command in found.items() if command is not None}


@click.command("run")
@click.argument("scenario_file", metavar="FILE.toml")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a key of the file (repeatable), e.g. --set concurrency=1,2 "
                   "--set url=http://127.0.0.1:8080.")
@click.option("--check", is_flag=True, help="Check every key and exit without sending a request.")
@click.pass_context
def run_command(ctx: click.Context, scenario_file: str, overrides: tuple[str, ...], check: bool) -> None:
    """Run a scenario file: `mode` (a command that writes a run, grid or tune) and the values of its flags, in TOML.

    A key is a flag's name without the dashes, `-` written `_` (--n-predict: n_predict); lists are
    TOML arrays (concurrency = [1, 2, 4]), durations numbers of seconds or strings ("6h").
    """
    commands = mode_commands(ctx)
    scenario = load_scenario(Path(scenario_file), commands).with_overrides(parse_set(s) for s in overrides)
    check_mode(scenario, commands)
    command = commands[scenario.mode]
    if scenario.mode in ("grid", "tune"):  # its measurement's keys go to the measurement
        from .grid import scenario_kwargs

        kwargs = scenario_kwargs(command, commands, scenario.settings, ctx,
                                 measure="capacity" if scenario.mode == "tune" else None)
    else:
        kwargs = resolve(command, scenario.settings, ctx)
    if check:
        ctx.meta[CHECK_ONLY] = True  # the command applies its rules across keys, then stops
    else:
        click.echo(f"loadgen run {scenario.source}: {scenario.mode}", err=True)
    try:
        ctx.invoke(command, **kwargs)
    except ScenarioError:
        raise
    except ConfigError as exc:  # a check across keys (no target, two prompt sources, ...)
        raise ScenarioError(f"{scenario.source}: {exc}") from None
    if check:
        click.echo(f"{scenario.source}: mode {scenario.mode}, {len(kwargs)} keys, all valid")
