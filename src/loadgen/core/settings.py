"""Settings declared once: a shared group of options as a typed record whose fields carry their flag.

Each field of a settings record is `Annotated[type, msgspec.Meta(bounds..., extra={...})]`: its
bounds (`ge`, `gt`, `le`, `lt`) and in `extra` its `flag` ("--timeout"), `help`, `panel` (the
heading of `--help` it is listed under, cli/help.py) and `goes` (where a run holds it: "generation"
for client/backends.py's GenerationParams, "config" for run/config.py's SweepConfig). cli/settings.py
derives the click options from the record and hands a command the one record, so adding a setting
to a group is one field here plus the code that uses it: no command's signature changes
(docs/development.md, "Adding a setting").

`RequestSettings` is the first group: how every request is sampled and timed, taken by every load
command. `--output`/`--force` are not in it: they say where a run is recorded, not how a request is
sent, and belong to the recording group (still by hand: cli/shared.py `recording_options`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import msgspec

from .errors import ConfigError

GENERATION, CONFIG = "generation", "config"  # where a field goes: GenerationParams, SweepConfig
TARGET, WORKLOAD = "Target", "Workload"  # cli/help.py CONCERNS' headings


class RequestSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How every request of a run is sampled and timed (`--temperature`, `--seed`, `--timeout`,
    `--stall-timeout`, `--wait-ready`): the field names are SweepConfig's and GenerationParams'."""

    temperature: Annotated[float, msgspec.Meta(ge=0, extra={
        "flag": "--temperature", "panel": WORKLOAD, "goes": GENERATION,
        "help": "Sampling temperature sent with every request."})] = 0.7
    seed: Annotated[int | None, msgspec.Meta(extra={
        "flag": "--seed", "panel": WORKLOAD, "goes": GENERATION,
        "help": "Sampling seed sent with every request."})] = None
    timeout_s: Annotated[float, msgspec.Meta(gt=0, extra={
        "flag": "--timeout", "panel": TARGET, "goes": CONFIG,
        "help": "Seconds before a request counts as timed out."})] = 600  # an int, so --help says [default: 600]
    stall_s: Annotated[float | None, msgspec.Meta(gt=0, extra={
        "flag": "--stall-timeout", "panel": TARGET, "goes": CONFIG,
        "help": "Seconds a response that has begun may send nothing before it counts as `stalled` (a stuck "
                "stream), not a `--timeout` minutes later; the wait for its body's first byte (a queue, "
                "a long prefill) never counts [default: off]."})] = None
    wait_ready_s: Annotated[float, msgspec.Meta(ge=0, extra={
        "flag": "--wait-ready", "panel": TARGET, "goes": CONFIG,
        "help": "Seconds to wait for a server that is still loading its model."})] = 60

    def __post_init__(self) -> None:
        if self.stall_s is not None and self.stall_s >= self.timeout_s:
            raise ConfigError(f"--stall-timeout {self.stall_s:g} is not below --timeout {self.timeout_s:g}: the "
                              "request would time out before it could stall")

    def generation(self) -> dict[str, Any]:
        """The fields GenerationParams holds, by name: `GenerationParams(..., **request.generation())`."""
        return _going(self, GENERATION)

    def config(self) -> dict[str, Any]:
        """The fields SweepConfig holds, by name: `SweepConfig(..., **request.config())`."""
        return _going(self, CONFIG)


@dataclass(frozen=True, slots=True)
class Setting:
    """One field of a settings record as an option reads it: its name, type (None's alternative taken
    out), whether None is allowed, default, bounds (its Meta) and what its Meta's `extra` says: the
    flag, help, metavar, --help panel, and where a run holds it (`goes`)."""

    name: str
    type: type
    optional: bool
    default: Any
    meta: msgspec.Meta
    flag: str
    help: str | None = None
    metavar: str | None = None
    panel: str | None = None
    goes: str | None = None


SAID = ("flag", "help", "metavar", "panel", "goes")  # the keys a field's Meta(extra=...) may hold


@functools.cache
def settings_of(record: type[msgspec.Struct]) -> tuple[Setting, ...]:
    """The fields of a settings record in declaration order; a field without a flag is a bug here."""
    hints = get_type_hints(record, include_extras=True)
    defaults = dict(zip(record.__struct_fields__[len(record.__struct_fields__) - len(record.__struct_defaults__):],
                        record.__struct_defaults__, strict=True))
    out = []
    for name in record.__struct_fields__:
        base, *metadata = get_args(hints[name])
        meta = next(m for m in metadata if isinstance(m, msgspec.Meta))
        said = {key: value for key, value in (meta.extra or {}).items() if key in SAID}
        if not said.get(SAID[0]):
            raise TypeError(f"{record.__name__}.{name} has no flag in its Meta(extra=...)")
        alternatives = get_args(base) if get_origin(base) is not None else (base,)  # float | None: a Union
        kinds = [a for a in alternatives if a is not type(None)]
        out.append(Setting(name, kinds[0], len(kinds) < len(alternatives), defaults.get(name, msgspec.NODEFAULT), meta,
                           **said))
    return tuple(out)


def _going(record: msgspec.Struct, where: str) -> dict[str, Any]:
    return {s.name: getattr(record, s.name) for s in settings_of(type(record)) if s.goes == where}
