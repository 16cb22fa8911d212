"""The command line's root: the `loadgen` group, the one place every command is named, and `main`.

Commands are imported when they are run (click's lazy group), so a command that reads results
never loads the engine, the transports or aiohttp, and `sim` does not load for the others. A
command's module imports at its top what its options need; what runs the command (the engine,
numpy, scipy, aiohttp) is imported in the functions that do the work, so `loadgen <command> --help`
loads none of it (tests/test_startup.py; benchmarks/startup.py times it).
Errors a user can cause end in `main` as one line on stderr and their exit code (core.errors);
tracebacks are left for loadgen's own bugs.
"""

from __future__ import annotations

import importlib
import sys

import click

from .. import __version__
from ..core.errors import EXIT_OK, EXIT_SIGINT, EXIT_USAGE, UserError
from ..core.kinds import FIND_LIMITS, KINDS, RUN_LOAD
from ..core.signals import LATCH

# The commands that write no run of their own kind; the run kinds come from core/kinds.py KINDS.
OTHER_COMMANDS = {
    "history": "loadgen.cli.history:history_command",
    "analyze": "loadgen.cli.analyze:analyze",
    "run": "loadgen.cli.run:run_command",
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
    "env": "loadgen.cli.env:env_command",
    "crossover": "loadgen.cli.crossover:crossover_command",
    "share": "loadgen.cli.share:share_command",
    "tune": "loadgen.cli.tune:tune_command",
    "bisect": "loadgen.cli.bisect:bisect_command",
}


# Each command's one-line help, so `loadgen --help` lists them without importing any (importing
# them all loaded scipy, numpy, matplotlib and aiohttp: 1.25 s). A test keeps it equal to the
# commands' own help; a command missing here is imported for its line.
_OTHER_HELP = {
    "history": "List the runs in the history store: time, kind, target, build, model, levels, best throughput, folder.",
    "ab": 'Run BASELINE and CANDIDATE sweeps in pairs (A B, B A, A B ...), --repeat times each, then gate them.',
    "analyze": "Reprint a saved run's tables and saturation verdicts, or a grid's summary (no server needed).",
    "calibrate": "Measure this machine's run-to-run noise from several runs of one unchanged configuration "
                 "(a folder of results directories, such as an A/A `loadgen ab`), for `compare` and `gate`.",
    "compare": 'Compare two sides (a sweep each, or a folder of runs each) per target and level: values, '
               'change, and whether it is more than the run-to-run noise.',
    "crossover": 'Say per concurrency whether speculative decoding pays or costs throughput, from a grid of '
                 'speculation on and off run interleaved and repeated.',
    "env": "Print this machine's fingerprint (CPU, memory, kernel, power, PCIe links, GPUs, servers) and warn "
           "about what would spoil a measurement.",
    "export": "Write a sweep's data as HdrHistogram .hgrm/.hlog files, CSV or JSON, or its records as JSON "
              'lines or Parquet.',
    "gate": 'Exit 1 when the candidate regressed beyond a limit by more than the run-to-run noise; 3 when the '
            'runs could enforce none of the limits on throughput and latency; else 0.',
    "grid": 'Start a server per combination of --param values, measure each, and compare the cells in one table.',
    "kv": 'Print which layers hold KV, bytes per token, and the KV cache and recurrent state llama.cpp allocates.',
    "observe": "Write prometheus.yml and a Grafana dashboard for these targets and loadgen's live metrics.",
    "paramcheck": 'Send canary requests direct and through a gateway; say per parameter honoured, dropped, '
                  'altered or cannot tell.',
    "report": "Charts, level tables and verdicts of one or more sweeps (or a grid's cells) or soaks, overlaid.",
    "run": 'Run a scenario file: `mode` (a command that writes a run, grid or tune) and the values of its flags, in TOML.',
    "sim": 'Run a simulated llama-server (same API, slots, batching and /metrics; no model needed).',
    "tune": "Find the server flags that serve the most users within latency targets (--slo): screen every cell, race "
            "the best.",
    "bisect": "Find the first commit that made the server slower: build, serve and measure midpoints, judged by "
              "the gate.",
    "share": "Bundle runs to share, with host and user names, paths, IP addresses and secrets redacted (a list of "
             "what was removed inside).",
}
COMMANDS = {**{k.name: k.command for k in KINDS.values()}, **OTHER_COMMANDS}  # every command: name -> where it is
COMMAND_HELP = {**{k.name: k.help for k in KINDS.values()}, **_OTHER_HELP}

# `loadgen --help` lists the commands in these groups, in this order (demo first: it needs no
# server). A test keeps every command in exactly one group.
COMMAND_GROUPS = {
    RUN_LOAD: (*(k.name for k in KINDS.values() if k.group == RUN_LOAD), "run", "ab"),
    FIND_LIMITS: (*(k.name for k in KINDS.values() if k.group == FIND_LIMITS), "grid", "tune", "bisect", "crossover", "kv"),
    "Read results": ("analyze", "report", "export", "compare", "gate", "calibrate", "history", "share"),
    "Servers and machine": ("sim", "env", "observe", "paramcheck"),
}


def short_help(text: str, limit: int) -> str:
    """A command's line in `loadgen --help`: its first sentence, cut at a word to `limit` with "..."
    (as click's own short help; click 8.5 made its helper private)."""
    first = text.split(". ", 1)[0].rstrip(".")
    if len(first) <= limit:
        return first
    cut = first[: max(limit - 3, 1)].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "..."


class LazyGroup(click.Group):
    """A group whose commands are imported from COMMANDS the first time they are asked for."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if any(n not in COMMAND_HELP for n in names):
            return super().format_commands(ctx, formatter)  # some command must be asked for its line
        limit = formatter.width - 6 - max(map(len, names), default=0)
        grouped = {n for group in COMMAND_GROUPS.values() for n in group}
        groups = [*COMMAND_GROUPS.items(), ("Other commands", tuple(n for n in names if n not in grouped))]
        for title, members in groups:
            rows = [(n, short_help(COMMAND_HELP[n], limit)) for n in members if n in names]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

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
