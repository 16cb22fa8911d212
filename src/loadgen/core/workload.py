"""A workload: the shape of every request of a run, drawn once with a seed.

A length is a fixed number or a distribution (`LengthSpec`, parsed from what `--prompt-tokens` and
`--n-predict` take):

    256                         every request asks for 256
    uniform:64:256              integers from 64 to 256, both included, equally likely
    normal:200,50,min=32,max=512
                                round(N(mean 200, sd 50)), clamped to [32, 512] (min defaults to 1)
    lognormal:200,150,max=4096  a lognormal whose lengths have mean 200 and sd 150 (so log-length has
                                sigma² = ln(1 + sd²/mean²) and mu = ln(mean) − sigma²/2), rounded and
                                clamped like normal
    file:lengths.txt            one of the file's integers (whitespace or comma separated), each
                                entry equally likely: an empirical distribution
    dataset                     (--n-predict only) each --dataset entry's recorded answer length

A `Workload` draws `shapes` request shapes (`RequestShape`) from its specs with numpy's PCG64 seeded
by `seed`: the prompt lengths from the stream `[seed, 0]`, the answer lengths from `[seed, 1]`, so
changing one spec never changes the other's draws, and two targets (or two runs) with the same
workload get the same sequence of shapes. Request number i of a level takes shape i mod `shapes`.

A shape is the one record both this issue's modes (lengths, datasets, traces) and the cache-aware
modes use: `prefix_id`/`prefix_tokens` name a prefix shared by every shape with that id (the salt
goes after it), `session`/`turn` a multi-turn conversation. They are None/0 here; no code in this
module reads them yet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:  # numpy is imported where a workload is drawn, so reading a record type does not load it
    import numpy as np

DISTRIBUTIONS = ("uniform", "normal", "lognormal", "file")  # and "dataset", --n-predict's alone
DEFAULT_SHAPES = 256  # distinct shapes a run draws; request i takes shape i mod this


@dataclass(frozen=True, slots=True)
class LengthSpec:
    """A token length: fixed (`kind` "fixed", `low` the value) or a distribution. `text` is the spec
    in its canonical spelling (what run.json shows and compare matches on)."""

    kind: str
    low: int = 0  # fixed: the value; uniform: the lowest
    high: int = 0  # uniform: the highest
    mean: float = 0.0  # normal, lognormal
    spread: float = 0.0  # normal, lognormal: the lengths' standard deviation
    minimum: int = 1  # normal, lognormal: clamp
    maximum: int | None = None
    values: tuple[int, ...] = ()  # file: the empirical lengths
    text: str = ""

    @property
    def fixed(self) -> int | None:
        return self.low if self.kind == "fixed" else None

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths (int64) drawn from this spec with `rng`."""
        import numpy as np

        if self.kind == "dataset":
            raise ValueError("a dataset's answer lengths are read, not drawn")
        if self.kind == "fixed":
            return np.full(n, self.low, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high, endpoint=True, size=n).astype(np.int64)
        if self.kind == "file":
            return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]
        if self.kind == "normal":
            raw = rng.normal(self.mean, self.spread, size=n)
        else:
            mu, sigma = lognormal_params(self.mean, self.spread)
            raw = rng.lognormal(mu, sigma, size=n)
        return np.clip(np.rint(raw), self.minimum, self.maximum if self.maximum is not None else None).astype(np.int64)

    def largest(self) -> int | None:
        """The largest length it can draw; None: unbounded (normal/lognormal without max)."""
        if self.kind in ("fixed",):
            return self.low
        if self.kind == "uniform":
            return self.high
        if self.kind == "file":
            return max(self.values)
        return self.maximum


def lognormal_params(mean: float, sd: float) -> tuple[float, float]:
    """(mu, sigma) of the log of a lognormal variable with this mean and standard deviation."""
    sigma2 = math.log1p((sd / mean) ** 2)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def _number(text: str, spec: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what} {spec!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"{what} {spec!r}: {text!r} is not a finite number")
    return value


def _whole(text: str, spec: str, what: str, least: int = 1) -> int:
    value = _number(text, spec, what)
    if value != int(value) or value < least:
        raise ConfigError(f"{what} {spec!r}: {text!r} is not a whole number of at least {least}")
    return int(value)


def parse_length_spec(text: str | int, what: str = "--prompt-tokens", base: Path | None = None) -> LengthSpec:
    """Parse a length spec (see the module docstring); ConfigError names the flag and the problem.
    A `file:` path is read relative to `base` (a scenario file's folder) when not absolute."""
    if isinstance(text, bool):
        raise ConfigError(f"{what}: expected a token count or a distribution like uniform:64:256")
    if isinstance(text, int):
        text = str(text)
    spec = text.strip()
    if spec.lower() == "dataset":  # each --dataset entry's recorded answer (run/dataset_answers.py)
        return LengthSpec("dataset", text="dataset")
    if re.fullmatch(r"\d+", spec):
        value = int(spec)
        if value < 1:
            raise ConfigError(f"{what} {spec}: must be at least 1")
        return LengthSpec("fixed", low=value, text=str(value))
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    if not sep or kind not in DISTRIBUTIONS:
        raise ConfigError(f"{what} {spec!r}: give a token count, or one of uniform:LOW:HIGH, "
                          "normal:MEAN,SD[,min=A,max=B], lognormal:MEAN,SD[,min=A,max=B], file:PATH")
    if kind == "file":
        return _file_spec(rest.strip(), spec, what, base)
    if kind == "uniform":
        parts = [p for p in re.split(r"[:,]", rest) if p.strip()]
        if len(parts) != 2:
            raise ConfigError(f"{what} {spec!r}: write uniform:LOW:HIGH, e.g. uniform:64:256")
        low, high = (_whole(p.strip(), spec, what) for p in parts)
        if high < low:
            raise ConfigError(f"{what} {spec!r}: the highest length is below the lowest")
        return LengthSpec("uniform", low=low, high=high, text=f"uniform:{low}:{high}")
    positional: list[float] = []
    named: dict[str, int] = {}
    for part in (p.strip() for p in rest.split(",")):
        if "=" in part:
            key, _, given = part.partition("=")
            if key.strip() not in ("min", "max"):
                raise ConfigError(f"{what} {spec!r}: unknown key {key.strip()!r} (min= and max= only)")
            named[key.strip()] = _whole(given.strip(), spec, what)
        elif part:
            positional.append(_number(part, spec, what))
    if len(positional) != 2:
        raise ConfigError(f"{what} {spec!r}: write {kind}:MEAN,SD[,min=A,max=B], e.g. {kind}:200,50,max=512")
    mean, sd = positional
    if mean <= 0 or sd < 0:
        raise ConfigError(f"{what} {spec!r}: the mean must be positive and the spread not negative")
    low, top = named.get("min", 1), named.get("max")
    if top is not None and top < low:
        raise ConfigError(f"{what} {spec!r}: max is below min")
    canon = f"{kind}:{mean:g},{sd:g},min={low}" + (f",max={top}" if top is not None else "")
    return LengthSpec(kind, mean=mean, spread=sd, minimum=low, maximum=top, text=canon)


def _file_spec(path: str, spec: str, what: str, base: Path | None) -> LengthSpec:
    where = Path(path)
    if base is not None and not where.is_absolute():
        where = base / where
    try:
        content = where.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{what} {spec!r}: cannot read {path}: {reason}") from None
    items = [s for s in re.split(r"[\s,]+", content) if s]
    values = []
    for n, item in enumerate(items, 1):
        if not re.fullmatch(r"\d+", item) or int(item) < 1:
            raise ConfigError(f"{what} {spec!r}: entry {n} ({item!r}) is not a positive whole number")
        values.append(int(item))
    if not values:
        raise ConfigError(f"{what} {spec!r}: {path} holds no lengths")
    # The canonical text names the values' count and sum, so two files of other contents differ.
    return LengthSpec("file", values=tuple(values), text=f"file:{where.name}[{len(values)} lengths, sum {sum(values)}]")


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What one request asks for. `prompt_tokens` None: the prompt text as given (not cut).

    Reserved for the cache-aware modes (not read yet): `prefix_id` and `prefix_tokens`, a prefix of
    that many tokens shared by every shape with the same id (the salt after it); `session` and
    `turn`, the conversation a request belongs to and its turn in it."""

    prompt_tokens: int | None
    n_predict: int
    prefix_id: int | None = None
    prefix_tokens: int = 0
    session: int | None = None
    turn: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    """The lengths a run's requests ask for. `prompt_tokens` None: prompts as given (not cut)."""

    prompt_tokens: LengthSpec | None
    n_predict: LengthSpec
    seed: int = 0
    shapes: int = DEFAULT_SHAPES

    @property
    def varies(self) -> bool:
        """Whether any length is drawn (else every request has one shape, as without a workload)."""
        return (self.prompt_tokens is not None and self.prompt_tokens.kind != "fixed") \
            or self.n_predict.kind != "fixed"

    @property
    def answers_from_dataset(self) -> bool:
        """`--n-predict dataset`: each request asks for its dataset entry's recorded answer length;
        the shapes are then the dataset's, measured per target (run/dataset_answers.py)."""
        return self.n_predict.kind == "dataset"

    def draw(self) -> tuple[RequestShape, ...]:
        """`shapes` request shapes, the same for the same workload (see the module docstring); none
        when the answers come from a dataset."""
        if self.answers_from_dataset:
            return ()
        import numpy as np

        n = self.shapes
        prompts = (self.prompt_tokens.draw(np.random.default_rng([self.seed, 0]), n).tolist()
                   if self.prompt_tokens is not None else [None] * n)
        answers = self.n_predict.draw(np.random.default_rng([self.seed, 1]), n).tolist()
        return tuple(RequestShape(p, a) for p, a in zip(prompts, answers))

    def to_dict(self) -> dict[str, Any]:
        """What run.json's config "workload" holds, and what compare/gate match two runs on."""
        return {"prompt_tokens": None if self.prompt_tokens is None else self.prompt_tokens.text,
                "n_predict": self.n_predict.text, "seed": self.seed, "shapes": self.shapes}


@dataclass(frozen=True, slots=True)
class DatasetEntry:
    """One dataset entry's prompt and recorded answer: a token count, or the answer's text (read by
    run/dataset_answers.py; here so the run's config can name it without importing the run)."""

    prompt: str
    answer: int | str
