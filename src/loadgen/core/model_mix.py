"""A mix of models across a run's requests (`--models`): which model each request asks a router for.

llama-server's router mode (`--models-dir`, `--models-preset`) serves many models from one port:
a request's `model` field names the model (an id of the router's `GET /models`), and the router
loads it on demand (`--models-autoload`, on by default), evicting the least recently used model
once `--models-max` are loaded (docs/router.md).

`--models smol-a:2,smol-b:1` weighs model ids across requests; `--models all` weighs every model the
router lists equally (resolved before the first level, run/router.py). Request `seq` asks for
`cycle[seq % len(cycle)]`: the weights laid out in one cycle of Σweights requests by smooth
weighted round robin (core/lora_mix.py's `weighted_cycle`), so equal weights alternate; the same
seq asks for the same model on every run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from .lora_mix import weighted_cycle, weighted_entries

ALL = "all"
# the failure kind of a request cut or refused because its model was unloaded under it (analysis/router.py)
MODEL_UNLOADED = "model_unloaded"
# a model id as routers name them: a file's stem or a preset's section (letters, digits, ._-/:)
_ENTRY = re.compile(r"([\w.\-/]+?)(?::(\d{1,6}))?")


class ModelEvent(msgspec.Struct, frozen=True):
    """A change of one model's `status.value` in the router's `GET /models`, as a poll saw it
    (`t_ns` on the records' clock, core/clock.py)."""

    t_ns: int
    model: str
    status: str  # "unloaded", "loading", "loaded", ... as the router says it


@dataclass(frozen=True, slots=True)
class ModelMix:
    """Model ids and their weights, in the order given; `entries` empty means every listed model (`all`)."""

    entries: tuple[tuple[str, int], ...]

    @property
    def every_listed(self) -> bool:
        return not self.entries

    @property
    def cycle(self) -> tuple[str, ...]:
        return weighted_cycle(self.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.entries)

    @property
    def spec(self) -> str:
        return ALL if self.every_listed else ",".join(f"{name}:{weight}" for name, weight in self.entries)

    def resolved(self, listed: list[str]) -> ModelMix:
        """`all` as every model of `listed` at weight 1; a mix of names as it is."""
        return ModelMix(tuple((name, 1) for name in listed)) if self.every_listed else self

    def missing(self, listed: list[str]) -> list[str]:
        """The names the mix asks for that the router does not list."""
        return [name for name in self.names if name not in listed]


def parse_model_mix(text: str) -> ModelMix:
    """`all`, or `NAME[:WEIGHT],...` (WEIGHT a whole number ≥ 1, 1 when left out); ConfigError otherwise."""
    if text.strip() == ALL:
        return ModelMix(())
    return ModelMix(weighted_entries(text, "--models", _ENTRY, "NAME[:WEIGHT] (NAME a model id of the router's "
                                     "/models, WEIGHT a whole number, e.g. smol-a:2,smol-b:1), nor `all`"))
