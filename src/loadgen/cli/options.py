"""Option types shared by the command-line flags and the scenario files.

Each type accepts what a user types on the command line ("1,2,4", "6h") and what a TOML file
holds ([1, 2, 4], 21600), and rejects anything else with one sentence. Because a scenario key is
converted by the same click parameter as its flag, a file and a flag can never disagree.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from ..analysis.trim import Trim
from ..core.errors import ConfigError
from ..core.lora_mix import LoraMix, parse_lora_mix
from ..core.model_mix import ModelMix, parse_model_mix
from ..core.request_class import RequestClass, parse_class, parse_class_flag
from ..core.workload import LengthSpec, parse_length_spec


class IntList(click.ParamType):
    """A comma-separated list of distinct integers within [minimum, maximum]; also a TOML array."""

    name = "list"

    def __init__(self, minimum: int = 1, maximum: int | None = None):
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[int, ...]:
        from ..run.config import parse_int_list

        if isinstance(value, tuple) and all(type(v) is int for v in value):
            text = ",".join(map(str, value))
        elif isinstance(value, list):
            if not value:
                self.fail("the list is empty", param, ctx)
            bad = next((v for v in value if type(v) is not int), None)
            if bad is not None:
                self.fail(f"expected integers, got {bad!r}", param, ctx)
            text = ",".join(map(str, value))
        elif type(value) is int:
            text = str(value)
        elif isinstance(value, str):
            text = value
        else:
            self.fail(f"expected a list of integers like 1,2,4, got {value!r}", param, ctx)
        try:
            return parse_int_list(text, "", minimum=self.minimum, maximum=self.maximum)
        except ConfigError as exc:
            self.fail(str(exc).removeprefix(": "), param, ctx)


class RateList(click.ParamType):
    """A comma-separated list of distinct positive request rates (requests/s); also a TOML array."""

    name = "rates"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        from ..run.config import parse_rate_list

        if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
            return value
        items = value if isinstance(value, list) else [value]
        if not items:
            self.fail("the list is empty", param, ctx)
        if any(isinstance(v, bool) or not isinstance(v, (int, float, str)) for v in items):
            self.fail(f"expected request rates like 0.5,1,2, got {value!r}", param, ctx)
        try:
            return parse_rate_list(",".join(map(str, items)), "")
        except ConfigError as exc:
            self.fail(str(exc).removeprefix(": "), param, ctx)


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration(text: str) -> float:
    """"90" or "90s" -> 90.0; "6h" -> 21600.0; "1h30m" -> 5400.0. Raises ValueError."""
    s = text.strip().lower().replace(" ", "")
    try:
        return float(s)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError(f"{text!r} is not a duration; write seconds (90) or 90s, 30m, 6h, 1h30m")
    return total


class Duration(click.ParamType):
    """Seconds, as a number or with units (90s, 30m, 6h, 1h30m); must be > 0."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, bool):
            self.fail(f"expected a duration like 90s or 6h, got {value!r}", param, ctx)
        if isinstance(value, (int, float)):
            seconds = float(value)
        elif isinstance(value, str):
            try:
                seconds = parse_duration(value)
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        else:
            self.fail(f"expected a duration like 90s or 6h, got {value!r}", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"{value!r} is not a positive duration", param, ctx)
        return seconds


class Length(click.ParamType):
    """A token length: a whole number, or a distribution spec (core/workload.py) such as
    uniform:64:256 or normal:200,50,max=512; a TOML integer or string."""

    name = "length"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> LengthSpec:
        if isinstance(value, LengthSpec):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            self.fail(f"expected a token count or a distribution like uniform:64:256, got {value!r}", param, ctx)
        try:
            return parse_length_spec(value, "")
        except ConfigError as exc:
            self.fail(str(exc).lstrip(" "), param, ctx)


class PercentileList(click.ParamType):
    """--percentiles: a comma-separated list of percentiles (50,95,99.9; analysis/metric_defs.py
    parses it); also a TOML array."""

    name = "percentiles"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        from ..analysis.metric_defs import parse_percentiles

        if isinstance(value, tuple):
            return value
        if isinstance(value, list):
            if any(isinstance(v, bool) or not isinstance(v, (int, float, str)) for v in value):
                self.fail(f"expected percentiles like 50,95,99.9, got {value!r}", param, ctx)
            value = ",".join(map(str, value))
        try:
            return parse_percentiles(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class TrimType(click.ParamType):
    """--trim: a share of each level's window ("10%", above 0 and below 50%) or a duration ("5s",
    "500ms") left out of its figures at each end (analysis/trim.py)."""

    name = "trim"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Trim:
        if isinstance(value, Trim):
            return value
        text = str(value).strip()
        if text.endswith("%"):
            try:
                share = float(text[:-1]) / 100
            except ValueError:
                self.fail(f"{text!r} is not a share; write e.g. 10%", param, ctx)
            if not 0 < share < 0.5:
                self.fail(f"{text} is out of range: a share above 0% and below 50% of each end", param, ctx)
            return Trim(share=share)
        return Trim(seconds=DURATION.convert(value, param, ctx))
class LoraMixType(click.ParamType):
    """--lora-mix: adapter ids (and `none`) with weights, e.g. 0:1,1:1,none:1 (core/lora_mix.py)."""

    name = "lora-mix"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> LoraMix:
        if isinstance(value, LoraMix):
            return value
        try:
            return parse_lora_mix(str(value))
        except ConfigError as exc:
            self.fail(str(exc).removeprefix("--lora-mix: "), param, ctx)


class ModelMixType(click.ParamType):
    """--models: a router's model ids with weights, e.g. smol-a:2,smol-b:1, or all (core/model_mix.py)."""

    name = "models"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> ModelMix:
        if isinstance(value, ModelMix):
            return value
        try:
            return parse_model_mix(str(value))
        except ConfigError as exc:
            self.fail(str(exc).removeprefix("--models: "), param, ctx)


class RequestClassType(click.ParamType):
    """A request class (core/request_class.py): a scenario file's `[[class]]` table, or a --class
    flag's `name=chat,prompt_tokens=64,n_predict=32,concurrency=1[,slo=ttft=2s]`."""

    name = "class"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> RequestClass:
        if isinstance(value, RequestClass):
            return value
        try:
            if isinstance(value, str):
                return parse_class(parse_class_flag(value), "--class")
            if isinstance(value, dict):
                return parse_class(value)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        self.fail(f"expected a [[class]] table or name=...,n_predict=..., got {value!r}", param, ctx)


LORA_MIX = LoraMixType()
MODEL_MIX = ModelMixType()
PORTS = IntList(1, 65535)
RATES = RateList()
LEVELS = IntList(1, 4096)
PROMPT_LENGTHS = IntList(1, 10_000_000)
DEPTHS = IntList(0, 10_000_000)
DURATION = Duration()
LENGTH = Length()
PERCENTILES = PercentileList()
TRIM = TrimType()
REQUEST_CLASS = RequestClassType()
