"""A mix of LoRA adapters across a run's requests (`--lora-mix`): which adapter each request asks for.

llama-server (`--lora FILE`) loads adapters numbered from 0 (`GET /lora-adapters`); a request's
`"lora": [{"id": ..., "scale": ...}]` chooses its own, every adapter it does not list at scale 0.
Requests whose adapters differ are not batched together (llama.cpp PR #10994): a mix costs
throughput that one adapter does not, and `loadgen ab` measures it (docs/lora.md).

`--lora-mix 0:1,1:1,none:1` weighs adapter ids (and `none`: the base model, every adapter at scale
0) across requests. Request `seq` asks for `cycle[seq % len(cycle)]`: the weights laid out in one
cycle of Σweights requests by smooth weighted round robin, so a mix of equal weights alternates
(0, 1, none, 0, 1, none, ...) and any window of the cycle's length holds each entry its weight's
worth. Deterministic per request index: the same seq asks for the same adapter on every run.

A request's adapter is written as its label: the id ("0", "1") or "none". `none` is sent as
adapter 0 at scale 0 (a list that is not empty: an empty or missing `lora` means the server's own
adapters at their start-up scales, not the base model).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import ConfigError

NONE = "none"
_ENTRY = re.compile(r"(none|\d{1,4}):(\d{1,6})")


@dataclass(frozen=True, slots=True)
class LoraMix:
    """Adapter labels ("0", "1", ..., "none") and their weights, in the order given."""

    entries: tuple[tuple[str, int], ...]

    @property
    def cycle(self) -> tuple[str, ...]:
        """One cycle of Σweights labels by smooth weighted round robin (ties go to the earlier entry)."""
        return weighted_cycle(self.entries)

    @property
    def ids(self) -> tuple[int, ...]:
        """The adapter ids the mix asks for (not `none`)."""
        return tuple(int(label) for label, _ in self.entries if label != NONE)

    @property
    def spec(self) -> str:
        return ",".join(f"{label}:{weight}" for label, weight in self.entries)

    def out_of_range(self, loaded: int) -> list[int]:
        """The ids the mix asks for that a server with `loaded` adapters does not have."""
        return [i for i in self.ids if i >= loaded]


def weighted_cycle(entries: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    """One cycle of Σweights labels by smooth weighted round robin (ties go to the earlier entry):
    equal weights alternate, and any window of the cycle's length holds each label its weight's worth."""
    total = sum(w for _, w in entries)
    current = [0] * len(entries)
    out = []
    for _ in range(total):
        for i, (_, weight) in enumerate(entries):
            current[i] += weight
        best = max(range(len(current)), key=lambda i: (current[i], -i))
        current[best] -= total
        out.append(entries[best][0])
    return tuple(out)


def weighted_entries(text: str, option: str, entry: re.Pattern[str], shape: str,
                     label: Callable[[str], str] = str) -> tuple[tuple[str, int], ...]:
    """`LABEL[:WEIGHT],...` of a mix option (`--lora-mix`, `--models`): each part matched by `entry`
    (its groups the label and the weight, 1 when left out), `label` normalising it; a part that does
    not match (said as `shape`), a weight of 0 or a label given twice is a ConfigError."""
    entries: list[tuple[str, int]] = []
    for part in text.split(","):
        match = entry.fullmatch(part.strip())
        if match is None:
            raise ConfigError(f"{option}: {part.strip()!r} is not {shape}")
        name, weight = label(match[1]), int(match[2] or 1)
        if weight < 1:
            raise ConfigError(f"{option}: {name}'s weight is 0; leave the entry out instead")
        if name in (seen for seen, _ in entries):
            raise ConfigError(f"{option}: {name} is given twice")
        entries.append((name, weight))
    return tuple(entries)


def parse_lora_mix(text: str) -> LoraMix:
    """`ID:WEIGHT,...` (ID an adapter id or `none`, WEIGHT a whole number ≥ 1); ConfigError otherwise."""
    return LoraMix(weighted_entries(
        text, "--lora-mix", _ENTRY, "ID:WEIGHT (ID an adapter id from the server's /lora-adapters or `none`, "
        "WEIGHT a whole number, e.g. 0:1,1:1,none:1)", lambda found: found if found == NONE else str(int(found))))


def lora_field(label: str) -> list[dict[str, float | int]]:
    """The request's `lora` list for an adapter label: that adapter at scale 1, or adapter 0 at 0."""
    if label == NONE:
        return [{"id": 0, "scale": 0.0}]
    return [{"id": int(label), "scale": 1.0}]


def applied_label(entries: Sequence[tuple[int, float]]) -> str:
    """The label of what the server says it applied (`generation_settings.lora`'s (id, scale) pairs):
    the ids at a scale other than 0 joined by "+", or "none"."""
    on = sorted(i for i, scale in entries if scale != 0)
    return "+".join(str(i) for i in on) if on else NONE
