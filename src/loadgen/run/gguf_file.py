"""A model file's metadata, read with llama.cpp's own `gguf` package (a dependency of loadgen).

Only the metadata and the tensors' sizes are read (the file is memory-mapped, its weights never
loaded), so a 20 GB model reads in a moment. The tokenizer's arrays are left out: nothing loadgen
computes needs them and they are the slow part.
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
        raise ConfigError("reading a GGUF needs the gguf package, a dependency of loadgen missing here: "
                          "pip install gguf") from None
    try:
        reader = gguf.GGUFReader(str(path))
        metadata = {name: field.contents() for name, field in reader.fields.items()
                    if not name.startswith(("tokenizer.", "GGUF."))}
        weights = sum(int(t.n_bytes) for t in reader.tensors)
    except OSError as exc:
        raise ConfigError(f"{path}: not a readable GGUF file ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - a damaged file fails inside gguf's parser in many ways (cut, bad counts)
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: not a readable GGUF file (damaged: {reason})") from None
    return GgufFacts(str(path), metadata, weights)
