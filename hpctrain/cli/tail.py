"""Print what a log file gained since the last look (for --follow and local runs)."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from hpctrain.contract.runfiles import copy_out


def echo_new(path: Path, offset: int, stream: TextIO) -> int:
    """Write the bytes of ``path`` after ``offset`` to ``stream`` (in blocks, regular files only); the new offset."""
    return copy_out(path, offset, stream)
