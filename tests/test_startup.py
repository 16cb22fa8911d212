"""The CLI starts without the heavy libraries: `loadgen --help`, `import loadgen.cli` and every
`loadgen <command> --help` load no scipy, matplotlib, numpy or aiohttp (they come with the work of the
commands that use them, imported in the functions that run it). benchmarks/startup.py times them."""

from __future__ import annotations

import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from loadgen.cli.main import COMMAND_HELP, COMMANDS, cli

HEAVY = ("scipy", "matplotlib", "numpy", "aiohttp")


def _imported(args: list[str]) -> set[str]:
    """Top-level packages a fresh interpreter imported, read from `python -X importtime`."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "100"}, check=True)
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_importing_the_cli_loads_no_heavy_library():
    names = _imported(["-c", "import loadgen.cli"])
    assert "loadgen" in names  # the reading works: the module itself shows
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_help_lists_every_command_without_importing_them():
    names = _imported(["-m", "loadgen", "--help"])
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


# A command whose --help truly needs a heavy library, and why. `report` and `export` (one module)
# list the exportable metrics in --metric's help from analysis/metric_defs.py, where a metric is
# defined beside its vectorised numpy form.
NEEDED_AT_HELP = {"report": {"numpy"}, "export": {"numpy"}}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_commands_help_imports_no_heavy_library(command):
    names = _imported(["-m", "loadgen", command, "--help"])
    assert "loadgen" in names
    heavy = names & set(HEAVY) - NEEDED_AT_HELP.get(command, set())
    assert not heavy, f"`loadgen {command} --help` imports {sorted(heavy)}"


def test_the_help_lines_are_the_commands_own():
    assert set(COMMAND_HELP) == set(COMMANDS)
    ctx = click.Context(cli)
    for name in COMMANDS:
        command = click.Group.get_command(cli, ctx, name) or cli.get_command(ctx, name)
        assert command.get_short_help_str(limit=300) == COMMAND_HELP[name], name


def test_the_help_groups_every_command_once_demo_first():
    from loadgen.cli.main import COMMAND_GROUPS

    grouped = [n for group in COMMAND_GROUPS.values() for n in group]
    assert sorted(grouped) == sorted(COMMANDS)  # each command in exactly one group
    out = CliRunner().invoke(cli, ["--help"]).output
    headings = [line[:-1] for line in out.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["Usage", "Options", *COMMAND_GROUPS] or headings == ["Options", *COMMAND_GROUPS], headings
    assert out.split("Run load:\n", 1)[1].split()[0] == "demo"
    assert "Other commands" not in out
