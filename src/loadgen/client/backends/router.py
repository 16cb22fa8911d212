"""A backend whose requests each name a model of a router (`--models`, core/model_mix.py), around any API's.

Body `seq` is the wrapped backend's body with its `model` field set to `cycle[seq % len(cycle)]`:
the wrapped body's own `model` (from --model or the server's /v1/models) is replaced, and a body
without one (llama-server's /completion) gains it. llama-server's router reads `model` from every
POST body it proxies, /completion's included. Reading the answers is the wrapped backend's, but for
the router's own failure when the model's instance went away under the request (an unload, an
eviction): HTTP 500 with the text "proxy error: ...", which is `model_unloaded`, no plain 5xx.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...core.model_mix import MODEL_UNLOADED, ModelMix
from ...core.records import ServerOutcome

_FIELD = b'"model":'


class ModelBackend:
    """`inner`'s requests, each naming the model the mix gives its index; the same API otherwise."""

    def __init__(self, inner: Any, mix: ModelMix):
        self.inner = inner
        self.name, self.method, self.path, self.stream = inner.name, inner.method, inner.path, inner.stream
        self.cycle = mix.cycle
        own = getattr(inner, "model", None)
        # the wrapped body's own `"model":"..."` (OpenAI APIs): replaced by the mix's. Its quotes cannot
        # occur unescaped inside a JSON string, so the first match is the field.
        self._own = _FIELD + msgspec.json.encode(own) if own is not None else None
        self._fields = [_FIELD + msgspec.json.encode(name) for name in self.cycle]
        self._build = inner.build
        self._parse = inner.parse
        self.event_reader = inner.event_reader

    def model_label(self, seq: int) -> str:
        """The model request `seq` asks for."""
        return self.cycle[seq % len(self.cycle)]

    def build(self, salt: str, index: int = 0) -> bytes:
        body = self._build(salt, index)
        field = self._fields[index % len(self._fields)]
        if self._own is not None and self._own in body:
            return body.replace(self._own, field, 1)
        return b"{" + field + b"," + body[1:]

    def parse(self, status: int, body: bytes) -> ServerOutcome:
        """The wrapped backend's outcome; a router's 5xx "proxy error: ..." (the model's instance
        went away under the request: unloaded, evicted) is `model_unloaded`."""
        outcome = self._parse(status, body)
        if outcome.error_kind is not None and status >= 500 and body.startswith(b"proxy error"):
            return msgspec.structs.replace(outcome, error_kind=MODEL_UNLOADED)
        return outcome

    def __getattr__(self, name: str) -> Any:  # anything else the engine asks of a backend: the wrapped one's
        return getattr(self.inner, name)
