"""The run kinds' one list (core/kinds.py): every kind is registered once, found by its command,
its view and its scenario mode; a run written before schema 4 is shown as the kind that made it.
Expected answers below were written down before the code ran."""

from __future__ import annotations

import importlib

import click
import pytest

from loadgen.core.kinds import KINDS, RunKind
from loadgen.core.rundoc import RunDocument


def test_run_kind_names_exactly_the_registered_kinds():
    assert sorted(k.value for k in RunKind) == sorted(KINDS)


def test_every_kind_imports_its_command_and_its_view():
    from loadgen.output.kind_view import KindView

    for kind in KINDS.values():
        module, _, attr = kind.command.partition(":")
        assert isinstance(getattr(importlib.import_module(module), attr), click.Command), kind.name
        if kind.view is not None:
            module, _, attr = kind.view.partition(":")
            assert isinstance(getattr(importlib.import_module(module), attr), KindView), kind.name


# kind, command line, expected: (kind shown, has levels, table section, has an answer line)
@pytest.mark.parametrize("kind, command, expected", [
    ("sweep", ["loadgen", "sweep"], ("sweep", True, None, False)),
    ("capacity", ["loadgen", "capacity"], ("capacity", True, None, True)),
    ("sweep", ["loadgen", "capacity", "--slo", "e2e=1s"], ("capacity", True, None, True)),  # before schema 4
    ("sweep", ["loadgen", "replay", "t.jsonl"], ("replay", True, None, False)),  # before schema 4
    ("sweep", ["loadgen", "prefill"], ("sweep", True, None, False)),  # prefill always said "prefill"
    ("sweep", ["loadgen", "grid"], ("sweep", True, None, False)),  # not a kind
    ("sweep", None, ("sweep", True, None, False)),
    ("prefill", ["loadgen", "prefill"], ("prefill", False, "prefill", False)),
    ("depth", None, ("depth", False, "depth", False)),
    ("soak", None, ("soak", False, None, False)),
    ("cache-capacity", None, ("cache-capacity", True, None, False)),
    ("slots", None, ("slots", False, "slots", True)),
])
def test_a_run_is_shown_by_the_view_of_the_kind_that_made_it(kind, command, expected):
    from loadgen.output.kind_view import kind_of, rows_section, view_of

    doc = RunDocument(targets=[], kind=RunKind(kind), command=command)
    view = view_of(doc)
    assert (kind_of(doc).value, kind_of(doc).has_levels, rows_section(doc), view.answer is not None) == expected


def test_help_groups_and_scenario_modes_come_from_the_registry():
    from loadgen.cli.main import COMMAND_GROUPS, COMMANDS
    from loadgen.cli.run import MODES

    assert all(COMMANDS[name] == kind.command for name, kind in KINDS.items())
    assert {n for group in COMMAND_GROUPS.values() for n in group} >= set(KINDS)
    # written down first: every kind a scenario may name, demo not (it takes no options), grid and tune
    assert MODES == ("sweep", "replay", "chat", "prefix", "soak", "capacity", "cache-capacity", "prefill", "depth",
                     "slots", "wake", "grid", "tune")


def test_a_scenario_file_runs_a_capacity_search(loadgen, tmp_path):
    path = tmp_path / "cap.toml"
    path.write_text('mode = "capacity"\nurl = "http://127.0.0.1:9"\nslo = "e2e=1s"\nmax_concurrency = 8\n')
    code, out, err = loadgen("run", path, "--check")
    assert code == 0, err
    assert "mode capacity" in out and "all valid" in out, out
    path.write_text('mode = "capacity"\nurl = "http://127.0.0.1:9"\nslo = "e2e=1s"\nbogus = 1\n')
    code, out, err = loadgen("run", path, "--check")
    assert code == 2 and "bogus" in err and "capacity" in err, err
