"""Backends: one module per server API. A backend builds a request body and reads a response.

It knows nothing about scheduling, connections or time: the engine hands it a salt and gets bytes;
it hands it a status and a body and gets a `ServerOutcome`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..records import ServerOutcome


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What every request of a run asks for, whatever the API."""

    prompt: str
    n_predict: int = 96
    temperature: float = 0.7
    ignore_eos: bool = True
    seed: int | None = None


class Backend(Protocol):
    name: str
    method: str
    path: str

    def build(self, salt: str) -> bytes: ...

    def parse(self, status: int, body: bytes) -> ServerOutcome: ...


def make_backend(api: str, params: GenerationParams) -> Backend:
    if api == "llamacpp":
        from .llamacpp import LlamaCppBackend

        return LlamaCppBackend(params)
    raise ValueError(f"unknown API {api!r}")


API_NAMES = ("llamacpp",)
