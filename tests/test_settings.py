"""Settings declared once (core/settings.py, cli/settings.py): a record's fields become click options
faithfully (flag, type, bounds refused in one line, defaults, help), the command gets the one record,
and every load command of the registry takes the whole request group and hands it on.
Expected answers below were written down before the code ran."""

from __future__ import annotations

import importlib
import inspect
from typing import Annotated

import click
import msgspec
import pytest
from click.testing import CliRunner

from loadgen.cli.settings import settings_options
from loadgen.core.kinds import KINDS
from loadgen.core.settings import RequestSettings, settings_of


class Example(msgspec.Struct, frozen=True, kw_only=True):
    rate: Annotated[float, msgspec.Meta(gt=0, le=10, extra={"flag": "--rate-x", "help": "A rate."})] = 1.5
    count: Annotated[int | None, msgspec.Meta(ge=1, extra={"flag": "--count", "help": "A count."})] = None
    name: Annotated[str, msgspec.Meta(extra={"flag": "--name", "help": "A name.", "metavar": "WHO"})] = "ann"
    loud: Annotated[bool, msgspec.Meta(extra={"flag": "--loud", "help": "A switch."})] = False


def _command(seen: list) -> click.Command:
    @click.command()
    @settings_options(Example, "example")
    @click.option("--other", default=3)
    def cmd(example, other):
        seen.append((example, other))
    return cmd


# argv, expected: the record the command gets and --other, or (exit code 2, the error's last line)
@pytest.mark.parametrize("argv, expected", [
    ([], (Example(rate=1.5, count=None, name="ann", loud=False), 3)),
    (["--rate-x", "10", "--count", "1", "--name", "bo", "--other", "4", "--loud"],
     (Example(rate=10.0, count=1, name="bo", loud=True), 4)),
    (["--rate-x", "0"], (2, "Error: Invalid value for '--rate-x': 0.0 is not in the range 0<x<=10.")),
    (["--rate-x", "10.5"], (2, "Error: Invalid value for '--rate-x': 10.5 is not in the range 0<x<=10.")),
    (["--count", "0"], (2, "Error: Invalid value for '--count': 0 is not in the range x>=1.")),
    (["--count", "two"], (2, "Error: Invalid value for '--count': 'two' is not a valid integer range.")),
])
def test_a_records_fields_are_its_commands_options(argv, expected):
    seen: list = []
    result = CliRunner().invoke(_command(seen), argv)
    if isinstance(expected[0], int):
        assert (result.exit_code, result.output.strip().splitlines()[-1]) == expected
        assert seen == []
    else:
        assert result.exit_code == 0, result.output
        assert seen == [expected]


def test_the_options_carry_the_fields_help_default_and_metavar():
    result = CliRunner().invoke(_command([]), ["--help"], terminal_width=200)
    lines = {line.split()[0]: line for line in result.output.splitlines() if line.strip().startswith("--")}
    assert "FLOAT RANGE" in lines["--rate-x"] and "A rate.  [default: 1.5; 0<x<=10]" in lines["--rate-x"]
    assert "A count.  [x>=1]" in lines["--count"] and "default" not in lines["--count"]  # None: none shown
    assert "WHO" in lines["--name"] and "[default: ann]" in lines["--name"]
    # the record's order, above the options declared below the decorator
    assert "A switch." in lines["--loud"] and "BOOLEAN" not in lines["--loud"]  # a flag takes no value
    assert list(lines) == ["--rate-x", "--count", "--name", "--loud", "--other", "--help"]


def test_a_field_without_a_flag_is_refused_when_declared():
    class NoFlag(msgspec.Struct, frozen=True):
        x: Annotated[int, msgspec.Meta(ge=0)] = 0

    with pytest.raises(TypeError, match="NoFlag.x has no flag"):
        settings_of(NoFlag)


def _load_commands() -> dict[str, click.Command]:
    out = {}
    for kind in KINDS.values():
        module, _, attr = kind.command.partition(":")
        out[kind.name] = getattr(importlib.import_module(module), attr)
    return out


def test_every_load_command_takes_the_whole_request_group_as_one_argument():
    flags = {s.flag for s in settings_of(RequestSettings)}
    assert flags >= {"--temperature", "--seed", "--timeout", "--stall-timeout", "--wait-ready"}
    fields = {s.name for s in settings_of(RequestSettings)}
    commands = _load_commands()
    # demo sends a fixed load to its own simulators: it takes no request settings (written down first)
    assert set(commands) - {"demo"} == {"sweep", "replay", "chat", "prefix", "soak", "capacity", "cache-capacity",
                                        "prefill", "depth", "slots", "wake"}
    for name, command in commands.items():
        if name == "demo":
            continue
        opts = {opt for param in command.params for opt in param.opts}
        assert flags | {"--output", "--force"} <= opts, name
        signature = inspect.signature(inspect.unwrap(command.callback))  # type: ignore[arg-type]
        assert "request" in signature.parameters, name
        assert not fields & set(signature.parameters), name  # no field one by one


def test_the_record_reaches_the_run_config_and_the_requests():
    from loadgen.cli.modes import base_config

    request = RequestSettings(temperature=0.0, seed=7, timeout_s=5, stall_s=2.5, wait_ready_s=0)
    config = base_config(ports=(8080,), host="127.0.0.1", urls=(), labels=(), api="llamacpp", model=None,
                         api_key=None, transport="fast", insecure=False, request=request, warmup=0, n_predict=8)
    assert (config.generation.temperature, config.generation.seed) == (0.0, 7)
    assert (config.timeout_s, config.stall_s, config.wait_ready_s) == (5, 2.5, 0)
    # every field goes somewhere a run holds it
    assert set(request.generation()) | set(request.config()) == {s.name for s in settings_of(RequestSettings)}


def test_a_scenario_key_is_read_by_the_fields_option(tmp_path):
    from loadgen.cli.main import cli

    scenario = tmp_path / "s.toml"
    scenario.write_text('mode = "sweep"\nports = [8080]\ntimeout = 0\n')
    result = CliRunner().invoke(cli, ["run", str(scenario), "--check"])  # loadgen's edge says it in one line
    assert str(result.exception).endswith("s.toml:3: timeout: 0.0 is not in the range x>0.")
    scenario.write_text('mode = "sweep"\nports = [8080]\ntimeout = 5\nstall_timeout = 1\nseed = 3\n')
    assert CliRunner().invoke(cli, ["run", str(scenario), "--check"]).exit_code == 0


def test_a_stall_timeout_not_below_the_timeout_is_one_line(loadgen, tmp_path):
    code, _, err = loadgen("sweep", "--url", "http://127.0.0.1:9", "--stall-timeout", "5", "--timeout", "1",
                           "--output", tmp_path / "run")
    assert code == 2 and "--stall-timeout 5 is not below --timeout 1" in err and len(err.strip().splitlines()) == 1
