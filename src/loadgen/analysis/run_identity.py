"""Are these runs of one configuration against one server? What `calibrate` asks before it calls
their spread the machine's run-to-run noise.

A noise floor is the spread of runs of one unchanged configuration. Runs of two servers (the sides
of an A/B) or of two configurations differ by more than noise, and a floor measured over them
would let a gate miss a real regression. So every run is held against the first, field by field:

- the targets: their labels, then per label what the server said of itself (run.json's `server`:
  `total_slots`, and from /props the model, its alias, the build and the per-slot context; the
  first /v1/models id for servers without /props), then its URL;
- the run's configuration (run.json's `config`: API, levels, requests, prompt, n_predict, stream,
  ...), every key but those that only change the verdict drawn from the figures.

A field missing or null in either run (an older run.json, a server that answers no /props) is
unknown, not a difference. Pure: run documents in, the first difference out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.rundoc import RunDocument, Target

# What the server said of itself, in the order a difference is reported (the most telling first).
PROPS_FIELDS = ("model_path", "model_alias", "build_info", "total_slots", "n_ctx")
# Config keys that change only the verdict drawn from the figures, not a figure.
VERDICT_ONLY = ("knee_gain", "knee_latency")


@dataclass(frozen=True, slots=True)
class Difference:
    """One field that differs between two runs, with both values."""

    field: str  # "smollm2's server total_slots", "config n_predict", "targets"
    first_run: str
    first: Any
    other_run: str
    other: Any

    def __str__(self) -> str:
        """"smollm2's server total_slots is 4 in baseline/01, 2 in candidate/01"; a long value
        (a prompt) is not quoted."""
        a, b = _shown(self.first), _shown(self.other)
        if len(a) > 40 or len(b) > 40:
            return f"{self.field} differs between {self.first_run} and {self.other_run}"
        return f"{self.field} is {a} in {self.first_run}, {b} in {self.other_run}"


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _targets(doc: RunDocument) -> dict[str, Target]:
    return {t.label: t for t in doc.targets}


def server_identity(target: Target) -> dict[str, Any]:
    """{field: value} of what identifies a target: its server's own account of itself, its URL."""
    server = target.server
    props = _mapping(server.props if server else None)
    models = server.models if server and isinstance(server.models, list) else []
    out: dict[str, Any] = {f"server {name}": props.get(name) for name in PROPS_FIELDS}
    if server and server.total_slots is not None:  # /props's, else the length of /slots
        out.update({"server total_slots": server.total_slots})
    out.update({"server model": models[0] if models else None, "url": target.url})
    return out


def configuration(doc: Mapping[str, Any]) -> dict[str, Any]:
    """{"config KEY": value} of the run's configuration as run.json holds it, every key (the typed
    document keeps only those its readers read), verdict-only keys left out."""
    return {f"config {key}": value for key, value in _mapping(doc.get("config")).items() if key not in VERDICT_ONLY}


def _first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    for key in [*a, *(k for k in b if k not in a)]:
        va, vb = a.get(key), b.get(key)
        if va is not None and vb is not None and va != vb:
            return key, va, vb
    return None


def difference(first: Mapping[str, Any], other: Mapping[str, Any],
               restarted: bool = False) -> tuple[str, Any, Any] | None:
    """(field, first's value, other's value) of the first field in which two run documents differ.
    `restarted`: the runs are repeats of one grid cell, whose server grid starts again for each on a
    port it picks, so the URL is not compared (the server's own account of itself still is)."""
    typed_a, typed_b = RunDocument.of(dict(first)), RunDocument.of(dict(other))
    if typed_a.kind != typed_b.kind:
        return "kind", typed_a.kind.value, typed_b.kind.value
    targets_a, targets_b = _targets(typed_a), _targets(typed_b)
    if sorted(targets_a) != sorted(targets_b):
        return "targets", ", ".join(sorted(targets_a)) or "none", ", ".join(sorted(targets_b)) or "none"
    for label in targets_a:
        a, b = server_identity(targets_a[label]), server_identity(targets_b[label])
        if restarted:
            a.pop("url"), b.pop("url")
        found = _first_difference(a, b)
        if found:
            return (f"{label}'s {found[0]}", *found[1:])
    return _first_difference(configuration(first), configuration(other))


def first_difference(runs: Sequence[tuple[str, Mapping[str, Any]]], restarted: bool = False) -> Difference | None:
    """Each (name, run document) against the first, in the order given: the first field that
    differs, or None when all are runs of one configuration against one server (`restarted`: see
    `difference`)."""
    if not runs:
        return None
    first_name, first_doc = runs[0]
    for name, doc in runs[1:]:
        found = difference(first_doc, doc, restarted)
        if found:
            return Difference(found[0], first_name, found[1], name, found[2])
    return None
