"""A model file's content fingerprint for the history's identity (issue 49): two runs of files of one
name and size but other contents (another fine-tune, a re-quantisation written over the old name)
are not like for like.

Not a hash of every byte: a 40 GB file would cost a minute of reading at the end of a run. A GGUF file
begins with its metadata and every tensor's name, type and shape (the quantisation is there) and ends
in tensor data, so the fingerprint is SHA-256 over the size, the first 8 MiB and the last 1 MiB: what
changes when the architecture, the quantisation or the weights change. It is computed once per file
(path, size and modification time) and cached in $XDG_CACHE_HOME/loadgen/model-fingerprints.json
(else ~/.cache/...); a file loadgen cannot read (a server on another machine) has none.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

HEAD, TAIL = 8 << 20, 1 << 20


def cache_path(environ: Mapping[str, str] | None = None) -> Path:
    env: Mapping[str, str] = os.environ if environ is None else environ
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loadgen" / "model-fingerprints.json"


def fingerprint_bytes(size: int, head: bytes, tail: bytes) -> str:
    """The fingerprint of a file of `size` bytes that begins with `head` and ends with `tail` (pure)."""
    digest = hashlib.sha256(str(size).encode() + b"\0" + head + b"\0" + tail)
    return digest.hexdigest()[:16]


def model_fingerprint(path: str | Path, cache: Path | None = None) -> str | None:
    """The fingerprint of the model file at `path`; None where it cannot be read here."""
    try:
        stat = os.stat(path)
        key = f"{Path(path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    except OSError:
        return None
    cache = cache_path() if cache is None else cache
    try:
        known = json.loads(cache.read_text())
        if isinstance(known, dict) and isinstance(known.get(key), str):
            return known[key]
    except (OSError, ValueError):
        known = {}
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD)
            f.seek(max(stat.st_size - TAIL, 0))
            tail = f.read(TAIL)
    except OSError:
        return None
    found = fingerprint_bytes(stat.st_size, head, tail)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        known = known if isinstance(known, dict) else {}
        tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**known, key: found}))
        os.replace(tmp, cache)
    except OSError:
        pass  # a cache it cannot write costs a re-read next time, nothing more
    return found
