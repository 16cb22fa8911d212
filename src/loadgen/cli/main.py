"""The command line's root: the `loadgen` group, the one place every command is named, and `main`.

Commands are imported when they are run (click's lazy group), so a command that reads results
never loads the engine, the transports or aiohttp, and `sim` does not load for the others.
Errors a user can cause end in `main` as one line on stderr and their exit code (core.errors);
tracebacks are left for loadgen's own bugs.
"""

from __future__ import annotations

import importlib
import sys

import click

from .. import __version__
from ..core.errors import EXIT_OK, EXIT_SIGINT, EXIT_USAGE, UserError
from ..core.signals import LATCH

COMMANDS = {
    "sweep": "loadgen.cli.sweep:sweep",
    "demo": "loadgen.cli.sweep:demo",
    "analyze": "loadgen.cli.analyze:analyze",
    "run": "loadgen.cli.run:run_command",
    "prefill": "loadgen.cli.modes:prefill_command",
    "depth": "loadgen.cli.modes:depth_command",
    "soak": "loadgen.cli.modes:soak_command",
    "sim": "loadgen.sim.cli:sim_command",
    "compare": "loadgen.cli.gate:compare_command",
    "gate": "loadgen.cli.gate:gate_command",
    "calibrate": "loadgen.cli.gate:calibrate_command",
    "ab": "loadgen.cli.ab:ab_command",
    "export": "loadgen.cli.report:export_command",
    "report": "loadgen.cli.report:report_command",
    "paramcheck": "loadgen.cli.paramcheck:paramcheck_command",
    "observe": "loadgen.cli.observe:observe_command",
    "kv": "loadgen.cli.kv:kv_command",
    "grid": "loadgen.cli.grid:grid_command",
}


class LazyGroup(click.Group):
    """A group whose commands are imported from COMMANDS the first time they are asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, _, attr = COMMANDS[cmd_name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="loadgen")
def cli() -> None:
    """Load generator and concurrency tester for llama-server and OpenAI-compatible LLM servers."""


def main() -> None:
    """Entry point: every error a user can cause becomes one line and an exit code; a SIGINT/SIGTERM
    that came during a run makes it 130/143, and none that comes later ends the process by itself."""
    try:
        _main()
        code: int | str | None = EXIT_OK
    except SystemExit as exc:
        code = exc.code
    signal_code = LATCH.exit_code
    LATCH.release()
    sys.exit(signal_code if signal_code is not None else code)


def _main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        sys.exit(EXIT_SIGINT)
    except click.ClickException as exc:
        click.echo(f"loadgen: error: {exc.format_message()}", err=True)
        sys.exit(getattr(exc, "user_exit_code", EXIT_USAGE))
    except UserError as exc:
        click.echo(f"loadgen: error: {exc}", err=True)
        sys.exit(exc.exit_code)
