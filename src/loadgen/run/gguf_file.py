"""A model file's metadata, read with llama.cpp's own `gguf` package (the optional extra `loadgen[gguf]`).

Only the metadata and the tensors' sizes are read (the file is memory-mapped, its weights never
loaded), so a 20 GB model reads in a moment. The tokenizer's arrays are left out: nothing loadgen
computes needs them and they are the slow part.

A damaged file (cut short, a count or a string length gone wrong) is a `ConfigError` in one line:
`gguf`'s reader walks the file with numpy views and fails on one with whatever error the bytes lead
it to (IndexError, ValueError, KeyError, ...), so every error it raises while reading is taken as the
file's, not loadgen's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GgufFacts:
    path: str
    metadata: dict[str, Any]
    weights_bytes: int  # the tensors' data, what loading the model takes before any cache


def read_gguf(path: str | Path) -> GgufFacts:
    """The metadata (key -> value) and the tensors' total size of a GGUF file; ConfigError if it
    cannot be read or the `gguf` package is missing."""
    try:
        import gguf
    except ImportError:
        raise ConfigError("reading a GGUF needs the gguf package: pip install 'loadgen[gguf]'") from None
    try:
        reader = gguf.GGUFReader(str(path))
        metadata = {name: field.contents() for name, field in reader.fields.items()
                    if not name.startswith(("tokenizer.", "GGUF."))}
        weights_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    except OSError as exc:
        raise ConfigError(f"{path}: not a readable GGUF file ({exc.strerror or exc})") from None
    except Exception as exc:  # noqa: BLE001 - the reader's error on a damaged file (see above)
        raise ConfigError(f"{path}: not a readable GGUF file ({_reason(exc)})") from None
    return GgufFacts(str(path), metadata, weights_bytes)


def _reason(exc: Exception) -> str:
    """The reader's complaint on one short line ("cut short" for numpy's out-of-bounds views)."""
    if isinstance(exc, IndexError):
        return "cut short or a count is wrong"
    text = " ".join(str(exc).split())[:160]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
