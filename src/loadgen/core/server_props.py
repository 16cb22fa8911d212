"""What loadgen reads of a llama-server's /props: its build, model, slots and context.

The JSON is the server's own (client/probe.py fetches it; run.json's per-target "server" and the
environment fingerprint store it as it came). The few fields read are typed here once, the others
ignored; a server whose /props is absent, not an object, or of another shape reads as all None.
"""

from __future__ import annotations

from typing import Any

import msgspec


class ServerProps(msgspec.Struct, frozen=True):
    """A /props answer as loadgen reads it (names as llama-server gives them)."""

    build_info: Any = None  # shown and compared as the server said it
    model_path: Any = None
    total_slots: int | None = None
    n_ctx: int | None = None

    @classmethod
    def of(cls, props: Any) -> ServerProps:
        """The typed fields of a /props answer (all None when it has none of this shape)."""
        if not isinstance(props, dict):
            return cls()
        try:
            return msgspec.convert(props, cls, strict=False)
        except msgspec.ValidationError:
            return cls()
