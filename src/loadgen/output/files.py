"""The one writer of rendered files: exporters and the report return (file name, bytes), this writes them."""

from __future__ import annotations

from pathlib import Path

ExportFiles = list[tuple[str, bytes]]  # (file name, content), in the order they are listed


def write_files(files: ExportFiles, out_dir: Path) -> list[Path]:
    """Write rendered files into out_dir; return their paths."""
    written = []
    for name, content in files:
        path = out_dir / name
        path.write_bytes(content)
        written.append(path)
    return written
