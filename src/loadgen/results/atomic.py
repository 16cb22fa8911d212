"""Writing a results file atomically: a temp file beside it, flushed to disk, then renamed over it.

Every file a results folder holds (run.json, requests.jsonl, probe.jsonl, capacity.json,
cache-capacity.json, ab.json, grid.json, noise.json) is written here, so a run killed mid-write
leaves the previous version or the new one, never half of either.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any


@functools.cache
def new_file_mode() -> int:
    """The mode open() gives a new file under this process's umask (0644 under umask 022): the atomic
    writes' temp files are made 0600, and a results file should read as the files beside it do.
    (os.umask can only be read by setting it, set straight back: once, before any writer thread.)"""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: Path, chunks: Iterable[str]) -> None:
    """`chunks` written to `path` whole, or `path` left as it was (the temp file removed)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, new_file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: Path, doc: Any, indent: int | None = 2) -> None:
    """`doc` as JSON (no NaN or infinity: JSON has none) written atomically to `path`."""
    atomic_write(path, [json.dumps(doc, indent=indent, allow_nan=False) + "\n"])


new_file_mode()  # read at import, while one thread runs
