"""Target labels: short names that tell a run's targets apart in every table, chart and file name.

A label the user gave (`--label`) is kept as given. Otherwise a target is named for its model: a
llama-server started without `--alias` reports its model's full path as `model_alias`, so a path
is cut to its file's stem (`/srv/models/SmolLM2-135M-Instruct.Q4_1.gguf` → `SmolLM2-135M-Instruct.Q4_1`,
a split GGUF's `-00001-of-00003` dropped too); a server that names no model is called by its
host:port. A default label is at most `MAX_LABEL` characters: a longer name loses the middle
(`SmolLM2-135M-Instru…Q4_1`), keeping its start (the family and size) and its last part (often
the quantisation); an address is never shortened. Two targets that would share a label get `@port` after it (`@host:port` when
their ports are the same too). The full model path stays in run.json (`server.props`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_LABEL = 24
_PATH_SEPARATORS = re.compile(r"[/\\]")
_GGUF_SUFFIX = re.compile(r"(-\d{5}-of-\d{5})?\.gguf$", re.IGNORECASE)
_TAIL = re.compile(r"[.\-:]([^.\-:]{1,8})$")  # the name's last part after . - or :, e.g. Q4_1


@dataclass(frozen=True, slots=True)
class LabelSource:
    """What names one target: the user's label, the server's word for its model, its URL."""

    url: str
    given: str | None = None  # --label
    model: str | None = None  # /props model_alias (a path without --alias), else the first /v1/models id
    address: str | None = None  # what to call it without a model name (host:port/path, keys masked); None: host:port


def model_stem(model: str) -> str:
    """The model's own name: the last part of a path, without `.gguf` (and a split file's part number)."""
    parts = [p for p in _PATH_SEPARATORS.split(model.strip()) if p]
    base = parts[-1] if parts else model.strip()
    return _GGUF_SUFFIX.sub("", base) or base


def shorten(name: str, limit: int = MAX_LABEL) -> str:
    """`name` in at most `limit` characters: the middle gives way to "…", the last part is kept."""
    if len(name) <= limit:
        return name
    tail_match = _TAIL.search(name)
    tail = tail_match.group(1) if tail_match and len(tail_match.group(1)) <= limit // 3 else ""
    head = name[:max(1, limit - 1 - len(tail))].rstrip(".-_: ")
    return f"{head}…{tail}"


def _hostport(url: str) -> tuple[str, str]:
    """(host:port, port), the port as written or the scheme's default."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.netloc, str(port)


def _base_name(source: LabelSource) -> str:
    if source.model and source.model.strip():
        return model_stem(source.model)
    return source.address or _hostport(source.url)[0]


def _suffixes(group: list[LabelSource]) -> list[str]:
    """What tells the targets of one group apart: their ports, else their addresses."""
    ports = [_hostport(s.url)[1] for s in group]
    if len(set(ports)) == len(ports):
        return [f"@{p}" for p in ports]
    return [f"@{_hostport(s.url)[0]}" for s in group]


def target_labels(sources: list[LabelSource]) -> list[str]:
    """One distinct label per target, in order (see the module docstring for the rule)."""
    bases = [_base_name(s) for s in sources]
    named = [bool(s.model and s.model.strip()) for s in sources]
    labels = [s.given or (shorten(b) if n else b) for s, b, n in zip(sources, bases, named)]  # addresses stay whole
    shared = {label for label, n in Counter(labels).items() if n > 1}
    out = list(labels)
    for label in shared:
        members = [i for i, s in enumerate(sources) if labels[i] == label and not s.given]
        for i, suffix in zip(members, _suffixes([sources[i] for i in members])):
            out[i] = shorten(bases[i], max(8, MAX_LABEL - len(suffix))) + suffix
    return _distinct(out, [s.given is not None for s in sources])


def _distinct(labels: list[str], given: list[bool]) -> list[str]:
    """Labels made distinct where shortening made two equal: a later default one gets #2, #3, ..."""
    taken = {label for label, fixed in zip(labels, given) if fixed}
    out: list[str] = []
    for label, fixed in zip(labels, given):
        candidate, n = label, 1
        while not fixed and candidate in taken:
            n += 1
            candidate = f"{label}#{n}"
        taken.add(candidate)
        out.append(candidate)
    return out


def about(label: str, text: str) -> str:
    """A line about one target: its label in front, unless the text names it already."""
    return text if label in text else f"{label}: {text}"
