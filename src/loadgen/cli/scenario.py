"""Scenario files: a TOML file of flag values, checked against the flags of the command it runs.

    # what this scenario measures ...
    mode = "sweep"              # sweep | prefill | depth | soak | grid
    ports = [8080, 8081]        # the key of --ports; every flag of the mode's command has one
    concurrency = [1, 2, 4, 8]
    n_predict = 96

A key is a flag's name without the dashes, with `_` for `-` (`--n-predict` -> `n_predict`,
`--url` -> `url`). Its value is converted by the very click parameter that reads the flag, so a
file and a command line accept exactly the same things. `--set key=value` overrides a key; its
value is read as TOML (`--set concurrency=[1,2]`), else as the text a flag would get
(`--set concurrency=1,2`, `--set url=http://127.0.0.1:8080`).

Every error names where the value came from, `FILE:LINE: key: what is wrong` (or `--set: key: ...`),
and is raised before any request is sent. tomllib reports no positions for keys, so the line of
each top-level key is found in the raw text.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from ..core.errors import ConfigError

MODE_KEY = "mode"
DEFAULT_MODE = "sweep"

_KEY_LINE = re.compile(r"""^\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_\-]+)\s*(?:\.|=)""")
_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")


class ScenarioError(ConfigError):
    """A scenario file or --set value the user must fix; the message starts with FILE:LINE: key:."""


@dataclass(frozen=True, slots=True)
class Setting:
    key: str
    value: Any
    where: str  # "path.toml:12" or "--set"


@dataclass(frozen=True, slots=True)
class Scenario:
    source: str  # the file as the user named it
    mode: str
    settings: dict[str, Setting] = field(default_factory=dict)
    mode_where: str = ""

    def with_overrides(self, overrides: Iterable[Setting]) -> Scenario:
        settings = dict(self.settings)
        mode, mode_where = self.mode, self.mode_where
        for s in overrides:
            if s.key == MODE_KEY:
                mode, mode_where = _mode(s), s.where
            else:
                settings[s.key] = s
        return replace(self, settings=settings, mode=mode, mode_where=mode_where)


def key_lines(text: str) -> dict[str, int]:
    """Line (1-based) of each key's first assignment in a TOML text.

    Top-level keys come before any [table] in TOML, so a key's first assignment is its top-level one.
    """
    lines: dict[str, int] = {}
    in_multiline: str | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if in_multiline is not None:  # inside a """ or ''' string: keys here are text
            if line.count(in_multiline) % 2 == 1:
                in_multiline = None
            continue
        m = _KEY_LINE.match(line)
        if m:
            key = m.group(1)
            if key[0] in "\"'":
                key = key[1:-1]
            lines.setdefault(key, n)
        for quote in ('"""', "'''"):
            if line.count(quote) % 2 == 1:
                in_multiline = quote
                break
    return lines


def _table_line(text: str, key: str) -> int | None:
    """Line of the `[key]` or `[key.sub]` header that made a key a table."""
    header = re.compile(r"^\s*\[\[?\s*[\"']?" + re.escape(key) + r"[\"']?\s*[.\]]")
    return next((n for n, line in enumerate(text.splitlines(), 1) if header.match(line)), None)


def load_scenario(path: Path, modes: Iterable[str]) -> Scenario:
    """Read a scenario file; raise ScenarioError naming the file (and line) on anything wrong."""
    source = str(path)
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{source}: no such scenario file") from None
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"{source}: not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = _TOML_POSITION.search(message)
        line = m.group(1) if m else (len(text.splitlines()) or 1) if "end of document" in message else None
        where = f"{source}:{line}" if line else source
        reason = _TOML_POSITION.sub("", message).replace("(at end of document)", "at the end of the file").strip()
        raise ScenarioError(f"{where}: not valid TOML ({reason})") from None
    lines = key_lines(text)
    settings: dict[str, Setting] = {}
    for key, value in data.items():
        line = lines.get(key) or (_table_line(text, key) if isinstance(value, list) else None)  # [[class]]
        where = f"{source}:{line}" if line else source
        if isinstance(value, dict):
            line = lines.get(key) or _table_line(text, key)
            raise ScenarioError(f"{source}:{line}: {key}: tables are not used; put every key at the top of the file"
                                if line else f"{source}: {key}: tables are not used")
        settings[key] = Setting(key, value, where)
    mode_setting = settings.pop(MODE_KEY, None)
    scenario = Scenario(source=source, mode=DEFAULT_MODE, settings=settings,
                        mode_where=mode_setting.where if mode_setting else source)
    if mode_setting is not None:
        scenario = replace(scenario, mode=_mode(mode_setting))
    check_mode(scenario, modes)
    return scenario


def _mode(s: Setting) -> str:
    if not isinstance(s.value, str):
        raise ScenarioError(f"{s.where}: {MODE_KEY}: expected a string such as \"sweep\", got {s.value!r}")
    return s.value


def check_mode(scenario: Scenario, modes: Iterable[str]) -> None:
    names = list(modes)
    if scenario.mode not in names:
        raise ScenarioError(f"{scenario.mode_where}: {MODE_KEY}: {scenario.mode!r} is not a mode; "
                            f"choose one of {', '.join(names)}")


def parse_set(text: str) -> Setting:
    """`--set key=value`: the value as TOML when it parses, else as the text a flag would get."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"--set {text!r}: expected KEY=VALUE, e.g. --set concurrency=1,2")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return Setting(key, value, "--set")


def setting_key(param: click.Parameter) -> str | None:
    """The scenario key of a click option: its longest flag without dashes, `-` -> `_`."""
    if not isinstance(param, click.Option) or not param.expose_value:
        return None
    flag = max((o for o in param.opts if o.startswith("--")), key=len, default=None)
    return flag[2:].replace("-", "_") if flag else None


def keys_of(command: click.Command) -> dict[str, click.Option]:
    """Every scenario key a command accepts, mapped to the option that reads it."""
    out: dict[str, click.Option] = {}
    for param in command.params:
        key = setting_key(param)
        if key is not None:
            assert isinstance(param, click.Option)
            out[key] = param
    return out


def _type_error(option: click.Option, value: Any) -> str | None:
    """A TOML value of the wrong kind for this option (before click converts it), or None."""
    kind = option.type
    if option.is_flag or isinstance(kind, click.types.BoolParamType):
        return None if isinstance(value, bool) else f"expected true or false, got {value!r}"
    if isinstance(value, bool):
        return f"expected {_expected(option)}, got {str(value).lower()}"
    if isinstance(kind, (click.types.IntParamType,)) and not isinstance(value, int):
        return f"expected an integer, got {value!r}"
    if isinstance(kind, click.types.FloatParamType) and not isinstance(value, (int, float)):
        return f"expected a number, got {value!r}"
    if isinstance(kind, (click.types.StringParamType, click.Path, click.Choice)):
        if option.multiple:
            items = value if isinstance(value, list) else [value]
            bad = next((v for v in items if not isinstance(v, str)), None)
            return None if bad is None else f"expected a string or a list of strings, got {bad!r}"
        return None if isinstance(value, str) else f"expected a string, got {value!r}"
    return None


def _expected(option: click.Option) -> str:
    kind = option.type
    if isinstance(kind, click.types.IntParamType):
        return "an integer"
    if isinstance(kind, click.types.FloatParamType):
        return "a number"
    if isinstance(kind, (click.types.StringParamType, click.Path, click.Choice)):
        return "a string"
    return f"a {kind.name}"


def resolve(command: click.Command, settings: Mapping[str, Setting], ctx: click.Context) -> dict[str, Any]:
    """Convert every setting with the option that reads its flag; {param name: value} for ctx.invoke."""
    options = keys_of(command)
    kwargs: dict[str, Any] = {}
    for key, s in settings.items():
        option = options.get(key)
        if option is None:
            raise ScenarioError(f"{s.where}: {key}: unknown key for mode {command.name!r}"
                                f"{suggestion(key, options)}")
        problem = _type_error(option, s.value)
        if problem:
            raise ScenarioError(f"{s.where}: {key}: {problem}")
        value = s.value
        if option.multiple and not isinstance(value, list):
            value = [value]
        try:
            kwargs[option.name] = option.type_cast_value(ctx, value)  # type: ignore[index]  # an option's name is set once declared
        except click.BadParameter as exc:
            raise ScenarioError(f"{s.where}: {key}: {exc.message}") from None
    return kwargs


def suggestion(key: str, options: Mapping[str, click.Option]) -> str:
    """" (did you mean 'n_predict'?)", or the keys there are."""
    import difflib

    close = difflib.get_close_matches(key, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; keys are: {', '.join(sorted(options))}"
