"""Request classes: several kinds of traffic sent against one server at the same time.

A class is one `[[class]]` table of a scenario file (or one `--class` flag):

    [[class]]
    name = "agent"              # what its records and rows are called
    prompt_tokens = 3000        # a length or a distribution (core/workload.py)
    n_predict = 16
    concurrency = 1             # its own load: concurrency (closed loop) ...
    # rate = 0.5                # ... or requests/s (open loop, Poisson), not both
    requests = 4                # its budget in each phase [default: max(8, 4×concurrency); rate: 16]
    slo = "ttft=2s"             # optional latency targets, --slo's syntax (analysis/slo.py)
    seed = 0                    # the seed of its drawn lengths [default: 0]

On the command line: `--class name=chat,prompt_tokens=64,n_predict=32,concurrency=1,slo=ttft=2s`
(keys as in the table; `slo` last, since its own value holds commas).

A run of classes (run/classes.py) sends each class alone first, then all of them together, so
each class's figures beside the others can be read against its own alone (analysis/interference.py).
This module is plain data and its parsing; the SLO text is checked where analysis is at hand
(cli/classes.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .workload import LengthSpec, Workload, parse_length_spec

KEYS = ("name", "prompt_tokens", "n_predict", "concurrency", "rate", "requests", "slo", "seed")
ALONE, TOGETHER = "alone", "together"  # the two phases of a run of classes
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One class of requests: its lengths (`workload`), its load (a concurrency, or a rate when
    `rate` is set), its request budget per phase, and its latency targets as --slo text (or None)."""

    name: str
    workload: Workload
    concurrency: int = 1
    rate: float | None = None
    requests: int = 8
    slo: str | None = None

    @property
    def load_text(self) -> str:
        return f"{self.rate:g} req/s" if self.rate is not None else f"concurrency {self.concurrency}"

    def to_dict(self) -> dict[str, Any]:
        """What run.json's config "classes" holds for it (core/rundoc.py `ClassSpec` reads it back)."""
        w = self.workload
        return {"name": self.name, "prompt_tokens": None if w.prompt_tokens is None else w.prompt_tokens.text,
                "n_predict": w.n_predict.text, "seed": w.seed, "shapes": w.shapes, "concurrency": self.concurrency,
                "rate": self.rate, "requests": self.requests, "slo": self.slo}


def _int(value: Any, key: str, where: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{where}: {key}: expected a whole number of at least {least}, got {value!r}")
    return value


def parse_class(table: Mapping[str, Any], where: str = "", base: Path | None = None) -> RequestClass:
    """One class from its table (TOML values, or the text values of a --class flag); ConfigError
    names `where` (a scenario file's own place is added by its reader), the class and the key. A
    `file:` length is read relative to `base`."""
    at = f"{where}: " if where else ""
    unknown = [k for k in table if k not in KEYS]
    if unknown:
        raise ConfigError(f"{at}unknown key {unknown[0]!r}; a class takes {', '.join(KEYS)}")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{at}name: give each class a short name of letters, digits, '-', '_' or '.', "
                          f"got {name!r}")
    where = f"{where} {name}".strip()
    if "n_predict" not in table:
        raise ConfigError(f"{where}: n_predict: missing; give its answer length, e.g. n_predict = 32")
    prompt: LengthSpec | None = None
    if "prompt_tokens" in table:
        prompt = parse_length_spec(_spec(table["prompt_tokens"], f"{where}: prompt_tokens"),
                                   f"{where}: prompt_tokens", base)
    answer = parse_length_spec(_spec(table["n_predict"], f"{where}: n_predict"), f"{where}: n_predict", base)
    if answer.kind == "dataset":
        raise ConfigError(f"{where}: n_predict: a class draws its lengths; 'dataset' answers are not taken here")
    seed = _int(table.get("seed", 0), "seed", where, 0)
    rate = None
    if "rate" in table:
        if "concurrency" in table:
            raise ConfigError(f"{where}: give its load as concurrency or rate, not both")
        rate = table["rate"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
            raise ConfigError(f"{where}: rate: expected requests/s above 0, got {rate!r}")
        rate = float(rate)
    concurrency = _int(table.get("concurrency", 1), "concurrency", where, 1)
    default_requests = 16 if rate is not None else max(8, 4 * concurrency)
    requests = _int(table.get("requests", default_requests), "requests", where, 1)
    slo = table.get("slo")
    if slo is not None and not isinstance(slo, str):
        raise ConfigError(f"{where}: slo: expected --slo's text, e.g. \"ttft=2s\", got {slo!r}")
    return RequestClass(name, Workload(prompt, answer, seed=seed), concurrency=concurrency, rate=rate,
                        requests=requests, slo=slo)


def _spec(value: Any, where: str) -> str | int:
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return value
    raise ConfigError(f"{where}: expected a token count or a distribution like \"uniform:64:256\", got {value!r}")


def parse_class_flag(text: str) -> dict[str, Any]:
    """A --class flag's `key=value,...` as a table: whole numbers and rates read as numbers, `slo`
    (always last) keeps the rest of the text, commas included."""
    table: dict[str, Any] = {}
    rest = text.strip()
    while rest:
        key, sep, tail = rest.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--class {text!r}: expected KEY=VALUE,..., e.g. name=chat,n_predict=32,concurrency=1")
        if key == "slo":
            table[key], rest = tail.strip(), ""
            break
        value, _, rest = tail.partition(",")
        value = value.strip()
        if key in ("concurrency", "requests", "seed") and re.fullmatch(r"\d+", value):
            table[key] = int(value)
        elif key == "rate":
            try:
                table[key] = float(value)
            except ValueError:
                raise ConfigError(f"--class {text!r}: rate {value!r} is not a number") from None
        else:
            table[key] = value
    return table


def check_classes(classes: tuple[RequestClass, ...], where: str) -> tuple[RequestClass, ...]:
    """Two classes may not share a name (their records and rows would mix)."""
    names = [c.name for c in classes]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise ConfigError(f"{where}: two classes are called {twice!r}; give each its own name")
    return classes
