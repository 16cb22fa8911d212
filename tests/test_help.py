"""`--help` groups options by concern, and one concept has one spelling: `--output` everywhere (the
old `--out` hidden but working), `--format` always a choice. In-process; no server."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from loadgen.cli.help import CONCERNS
from loadgen.cli.main import COMMANDS, cli

FIXTURE = Path(__file__).parent / "data" / "sweep-smollm2"


def _commands() -> dict[str, click.Command]:
    ctx = click.Context(cli)
    return {name: cli.get_command(ctx, name) for name in COMMANDS}


def _options(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def test_sweep_help_lists_its_options_under_each_concern_in_order():
    result = CliRunner().invoke(cli, ["sweep", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    heads = [title for title in CONCERNS if f"─ {title} " in result.output]
    assert heads == ["Target", "Load shape", "Workload", "Latency targets", "Output", "Scale-out", "Machine"]
    at = {title: result.output.index(f"─ {title} ") for title in heads}
    assert at["Target"] < result.output.index("--url") < at["Load shape"] < result.output.index("--concurrency")
    assert at["Output"] < result.output.index("--records-format") < at["Scale-out"] < result.output.index("--workers")
    assert at["Scale-out"] < at["Machine"] < result.output.index("--env-interval")


def test_every_concern_names_options_that_exist():
    every = {opt for command in _commands().values() for opt in _options(command)}
    assert [o for options in CONCERNS.values() for o in options if o not in every] == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_one_spelling_of_output_and_format(name):
    options = _options(_commands()[name])
    if "--out" in options:
        assert options["--out"].hidden and "--output" in options, "--out is only a hidden alias of --output"
    if "--format" in options:
        assert isinstance(options["--format"].type, click.Choice)


@pytest.mark.parametrize("flag", ["--output", "--out"])
def test_export_writes_where_output_or_its_old_spelling_says(tmp_path, flag):
    result = CliRunner().invoke(cli, ["export", str(FIXTURE), "--format", "csv", flag, str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["levels.csv", "requests.csv"]


@pytest.mark.parametrize("args", [
    ["export", str(FIXTURE), "--format", "xml"],
    ["report", str(FIXTURE), "--format", "pdf"],
    ["kv", "model.gguf", "--format", "yaml"],
])
def test_a_format_not_offered_is_one_line_and_exit_2(loadgen, args):
    code, out, err = loadgen(*args)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "'--format'" in lines[0] and "is not one of" in lines[0], err
