"""A backend whose requests each carry a LoRA adapter (`--lora-mix`, core/lora_mix.py), around any API's.

Body `seq` is the wrapped backend's body with `"lora": [...]` added: the adapter of
`mix.cycle[seq % len(cycle)]` at scale 1 (or, for `none`, adapter 0 at scale 0). llama-server
reads the field on every API it serves (/completion and the OpenAI ones).

What the server applied: llama-server echoes the request's adapters as `generation_settings.lora`
(`[{"id", "scale"}]`) in /completion's answer and in its streamed final event; the reader picks
that list out of the one event or body that holds it and the outcome carries its label
(`lora_applied`: the ids at a non-zero scale, or "none"). The OpenAI APIs' answers carry no
`generation_settings`, so their records say nothing (`lora_applied` None): only the ids' range is
checked there, against `/lora-adapters` before the first level (run/lora.py).

Only a run with a mix builds this backend: a plain run's bodies and stream reading are untouched.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core.lora_mix import LoraMix, applied_label, lora_field
from ...core.records import ServerOutcome
from ..sse import EventReader
from .wrapped import Wrapped

_KEY = b'"generation_settings"'


class _Lora(msgspec.Struct):
    id: int = -1
    scale: float = 0.0


class _Settings(msgspec.Struct):
    lora: list[_Lora] | None = None


class _Echo(msgspec.Struct):
    """The part of a /completion answer (or final stream event) that says which adapters applied."""

    generation_settings: _Settings | None = None


_decode_echo = msgspec.json.Decoder(_Echo).decode


def applied(body: bytes) -> str | None:
    """The label of the adapters a /completion answer says it applied; None when it says nothing."""
    if _KEY not in body:
        return None
    try:
        settings = _decode_echo(body).generation_settings
    except msgspec.DecodeError:
        return None  # the wrapped backend reports an unreadable body
    if settings is None or settings.lora is None:
        return None
    return applied_label([(entry.id, entry.scale) for entry in settings.lora])


def _with_applied(outcome: ServerOutcome, label: str | None) -> ServerOutcome:
    if label is None or outcome.error_kind is not None:
        return outcome
    return msgspec.structs.replace(outcome, lora_applied=label)


class LoraBackend:
    """`inner`'s requests, each with the adapter the mix gives its index; the same API otherwise."""

    def __init__(self, inner: Wrapped, mix: LoraMix):
        self.inner = inner
        self.name, self.method, self.path, self.stream = inner.name, inner.method, inner.path, inner.stream
        self.cycle = mix.cycle
        self._fields = [b',"lora":' + msgspec.json.encode(lora_field(label)) + b"}" for label in self.cycle]
        self._build = inner.build

    def lora_label(self, seq: int) -> str:
        """The adapter label request `seq` asks for."""
        return self.cycle[seq % len(self.cycle)]

    def build(self, salt: str, index: int = 0) -> bytes:
        body = self._build(salt, index)
        # every API's body is one JSON object: the field goes before its closing brace
        return body[:body.rindex(b"}")] + self._fields[index % len(self._fields)]

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        return _with_applied(self.inner.parse(status, body), applied(body))

    def event_reader(self) -> EventReader:
        return _AppliedReader(self.inner.event_reader())


class _AppliedReader:
    """The wrapped reader, and the `generation_settings.lora` of the event that carries it."""

    def __init__(self, inner: EventReader):
        self._inner = inner
        self._label: str | None = None

    def __getattr__(self, name: str) -> Any:  # count_region, answer_events, ...: the wrapped reader's
        return getattr(self._inner, name)

    def events(self, payloads: list[bytes]) -> int:
        for data in payloads:
            if _KEY in data:
                self._label = applied(data)
        return self._inner.events(payloads)

    def finish(self) -> ServerOutcome:
        return _with_applied(self._inner.finish(), self._label)
