"""Print what a log file gained since the last look (for --follow and local runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO


def echo_new(path: Path, offset: int, stream: TextIO) -> int:
    """Write the bytes of ``path`` after ``offset`` to ``stream``; return the new offset."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return offset
    if chunk:
        stream.write(chunk.decode("utf-8", errors="replace"))
        stream.flush()
    return offset + len(chunk)
