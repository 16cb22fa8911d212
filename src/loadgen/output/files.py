"""The one writer of rendered files: exporters and the report return (file name, bytes), this writes them."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

ExportFiles = list[tuple[str, bytes]]  # (file name, content), in the order they are listed


def file_safe(label: str) -> str:
    """A target label as a file-name part: path separators and odd characters become '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "target"


def write_files(files: ExportFiles, out_dir: Path) -> list[Path]:
    """Write rendered files into out_dir; return their paths."""
    written = []
    for name, content in files:
        path = out_dir / name
        path.write_bytes(content)
        written.append(path)
    return written


def remove_files(out_dir: Path, is_own: Callable[[str], bool]) -> list[Path]:
    """Delete the files in out_dir whose names `is_own` claims (a writer's earlier output, before it
    writes anew); anything else there is left alone. Returns what was removed."""
    removed = []
    if out_dir.is_dir():
        for path in sorted(out_dir.iterdir()):
            if path.is_file() and is_own(path.name):
                path.unlink()
                removed.append(path)
    return removed
