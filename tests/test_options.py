"""The option types shared by flags and scenario files, and the scenario file reader's parts."""

from __future__ import annotations

import click
import pytest

from loadgen.cli.options import DURATION, LEVELS, PORTS, parse_duration
from loadgen.cli.scenario import ScenarioError, key_lines, load_scenario, parse_set


@pytest.mark.parametrize("value,expected", [("1,2,4", (1, 2, 4)), ([1, 2, 4], (1, 2, 4)), (8, (8,)), ("8", (8,))])
def test_int_lists_from_flags_and_files(value, expected):
    assert LEVELS.convert(value, None, None) == expected


@pytest.mark.parametrize("value,message", [
    ([], "empty"), (["1"], "expected integers"), ([0], "out of range"), ("1,1", "twice"), (True, "expected a list"),
    ([True], "expected integers"), (1.5, "expected a list"),
])
def test_bad_int_lists(value, message):
    with pytest.raises(click.BadParameter, match=message):
        LEVELS.convert(value, None, None)


def test_ports_range():
    with pytest.raises(click.BadParameter, match="between 1 and 65535"):
        PORTS.convert([70000], None, None)


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("6h", 21600), ("1h30m", 5400),
                                          ("250ms", 0.25), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)
    assert DURATION.convert(text, None, None) == pytest.approx(seconds)


@pytest.mark.parametrize("value", ["-5", -5, 0, "6 hours", "h", True, [1]])
def test_bad_durations(value):
    with pytest.raises(click.BadParameter):
        DURATION.convert(value, None, None)


def test_key_lines_skip_multiline_strings_and_find_quoted_keys():
    text = '# header\nmode = "sweep"\n\nprompt = """\nports = 1\n"""\n"n_predict" = 5\nports = [\n 1,\n]\n'
    assert key_lines(text) == {"mode": 2, "prompt": 4, "n_predict": 7, "ports": 8}


def test_set_values_are_toml_else_text():
    assert parse_set("concurrency=[1, 2]").value == [1, 2]
    assert parse_set("concurrency=1,2").value == "1,2"
    assert parse_set("url=http://127.0.0.1:8080").value == "http://127.0.0.1:8080"
    assert parse_set("n_predict=16").value == 16
    assert parse_set("prompt=hello world").value == "hello world"
    with pytest.raises(ScenarioError, match="KEY=VALUE"):
        parse_set("novalue")


def test_invalid_toml_names_its_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('mode = "sweep"\nports = [8080,\nn_predict = \n')
    with pytest.raises(ScenarioError, match=r"broken\.toml:\d+: not valid TOML"):
        load_scenario(path, ["sweep"])


def test_a_table_is_refused_at_its_header(tmp_path):
    path = tmp_path / "table.toml"
    path.write_text('mode = "sweep"\n\n[sweep]\nports = [1]\n')
    with pytest.raises(ScenarioError, match=r"table\.toml:3: sweep: tables are not used"):
        load_scenario(path, ["sweep"])
