"""The backend a wrapper wraps (lora.py, images.py): any API's `Backend`, said again here because the
package's face imports the wrappers."""

from __future__ import annotations

from typing import Protocol

from ...core.records import ServerOutcome
from ..sse import EventReader


class Wrapped(Protocol):
    name: str
    method: str
    path: str
    stream: bool

    def build(self, salt: str, index: int = 0) -> bytes: ...

    def parse(self, status: int, body: bytes) -> ServerOutcome: ...

    def event_reader(self) -> EventReader: ...
