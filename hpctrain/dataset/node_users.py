"""Who still uses a job's folder on a node: each task registers under ``users/`` by PID and start time.

The registry both sides of a node's dataset mount read: the tasks
(``node_folder.py``: join, leave, the last one releases) and the detached
watcher (``mount_release.py``: it waits until no registered task is left).
An entry names a process by its PID *and* its start time (``/proc/PID/stat``),
so a PID reused by another process does not count as a user. torch-free,
stdlib only.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def user_entry(folder: Path, pid: int) -> Path:
    return folder / "users" / f"{pid}-{start_time(pid)}"


class users_lock:  # noqa: N801 (used like a function: ``with users_lock(folder):``)
    """An exclusive lock over the node's user registrations (the last one to leave releases the folder)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "users.lock"

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # closing drops the lock


def live_users(users_dir: Path) -> list[int]:
    """Registered tasks still running (the PID and its start time both match)."""
    alive = []
    try:
        entries = list(users_dir.iterdir())
    except OSError:
        return []
    for entry in entries:
        pid, _, started = entry.name.partition("-")
        if pid.isdigit() and started and start_time(int(pid)) == started:
            alive.append(int(pid))
    return alive


def start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""
