"""The click options of a settings record (core/settings.py), derived from its fields.

`settings_options(RequestSettings, "request")` declares one option per field (its flag, help,
default, bounds as click's Int/FloatRange, the field's name as the parameter's) and hands the
command ONE argument, `request`, the record built from them. Because scenario files (`loadgen run`)
and grid/tune's measure arguments go through the same options, they read the group too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import msgspec

from ..core.settings import Setting, settings_of


def option_of(setting: Setting) -> click.Option:
    """The click option reading one field: its type and bounds, default and help from the field."""
    meta = setting.meta
    kind: click.ParamType
    low = meta.ge if meta.gt is None else meta.gt
    high = meta.le if meta.lt is None else meta.lt
    bounded = low is not None or high is not None
    if setting.type is float:
        kind = click.FloatRange(low, high, min_open=meta.gt is not None, max_open=meta.lt is not None) \
            if bounded else click.FLOAT
    elif setting.type is int:  # an int field's bounds are whole (msgspec's Meta types them int | float)
        kind = click.IntRange(None if low is None else int(low), None if high is None else int(high),
                              min_open=meta.gt is not None, max_open=meta.lt is not None) if bounded else click.INT
    elif setting.type is bool:
        kind = click.BOOL
    else:
        kind = click.STRING
    default = None if setting.default is msgspec.NODEFAULT else setting.default
    option = click.Option([setting.flag, setting.name], type=kind, default=default, help=setting.help,
                          show_default=default is not None, metavar=setting.metavar,
                          required=setting.default is msgspec.NODEFAULT, is_flag=setting.type is bool or None)
    option.panel = setting.panel  # type: ignore[attr-defined]  # read by cli/help.py's panels
    return option


def settings_options(record: type[msgspec.Struct], argument: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator giving a command the options of `record`'s fields and calling it with
    `argument=record(...)` in their place."""
    settings = settings_of(record)

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)  # copies __click_params__: the options declared below this decorator stay
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {s.name: kwargs.pop(s.name) for s in settings if s.name in kwargs}
            return f(*args, **{argument: record(**values)}, **kwargs)

        below = getattr(command, "__click_params__", [])  # click lists them bottom-up and reverses them
        # click's own attribute, which functools.wraps copied and mypy does not know
        command.__click_params__ = [*below, *(option_of(s) for s in reversed(settings))]  # type: ignore[attr-defined]  # click's attribute
        return command
    return decorate
