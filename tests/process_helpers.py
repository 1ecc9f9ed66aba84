"""Waiting on and looking at real processes in tests (the one definition)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path


def wait_until(probe: Callable[[], object], timeout: float = 10.0) -> None:
    """Return once ``probe()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    """Running and not a zombie (an orphan's reaper may not have collected it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
