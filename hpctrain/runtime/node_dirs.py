"""A task's private folder in the node's temp dir, and its safe removal after the task, however it ended.

A torchrun node task keeps its ranks' results and markers in such a folder
(programs/torchrun_node.py). Its own ``finally`` removes it, but a task that
is SIGKILLed (Slurm's last kill after KillWait, the OOM killer) runs no
``finally``. So the folder is *named* first (:func:`planned`), the task's
reaper (runtime/cleanup.py) is told that name when it starts, and only then is
the folder made (:func:`create`): there is no moment in which it exists and
nobody will remove it. The reaper removes it once the task is gone
(:func:`remove_owned`), after the task's processes, which may still write in it.

The reaper is no help where Slurm's last SIGKILL ends every process of the
step at once, itself included (``proctrack/cgroup``, KillWait after a cancel
or the time limit). So the folder's name also says whose it is -- host, PID and
that PID's start time (``/proc/PID/stat``) -- and a later task of the same kind
of this user on the host removes those whose task is gone (:func:`sweep`).

The reaper removes only a path it was handed at start, never one it read from
a place another user can write, and checks it again first: an absolute path
without symlinks on the way, a name with :data:`PREFIX`, a directory (not a
symlink) owned by this user; the sweep removes only names of its host whose
task has ended, through the same checks. The folder goes to a site's
job-scoped temp dir where there is one (the site removes it at the job's end
in any case): the first existing folder of ``$SLURM_TMPDIR`` and ``$TMPDIR``,
else ``/tmp``, as ``data.stage_dir``'s default (trainer/data/staging.py).
Standard library only: the reaper imports this and must start in well under a second.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

PREFIX = "hpctrain-"  # the only names a reaper ever removes
_NAME = re.compile(  # what planned() makes: KIND, a random part, the task's PID, its start, its host
    r"hpctrain-(?P<kind>[a-z]+)-[0-9a-f]{16}-(?P<pid>\d{1,10})-(?P<start>\d{1,20})-(?P<host>[A-Za-z0-9_.-]{1,64})"
)


def temp_dir(env: Mapping[str, str], exists: Callable[[str], bool] = os.path.isdir) -> str:
    """The node's temp dir for a task: ``$SLURM_TMPDIR`` or ``$TMPDIR`` if ``exists`` (a folder), else ``/tmp``
    (also ``data.stage_dir``'s default: trainer/data/staging.py)."""
    candidates = (env.get("SLURM_TMPDIR"), env.get("TMPDIR"))
    return next((c for c in candidates if c and exists(c)), "/tmp")


def planned(kind: str, env: Mapping[str, str] | None = None) -> Path:
    """A fresh, not yet existing folder name for this process (symlinks on the way resolved):
    ``TEMP/hpctrain-KIND-RANDOM-PID-START-HOST``, START the process's start time in clock ticks."""
    base = os.path.realpath(temp_dir(os.environ if env is None else env))
    pid = os.getpid()
    return Path(base) / f"{PREFIX}{kind}-{secrets.token_hex(8)}-{pid}-{process_start(pid) or 0}-{_host()}"


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot (``/proc/PID/stat``); None if there is none."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            text = handle.read(4096)
        return int(text[text.rindex(b")") + 2 :].split()[19])  # field 22; the name before it may hold anything
    except (OSError, ValueError, IndexError):
        return None


def sweep(kind: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Remove this user's KIND folders in the temp dir made on this host by a task that is gone; what was
    removed. A folder whose task lives (same PID, same start time) is left, and so is any other name."""
    base = os.path.realpath(temp_dir(os.environ if env is None else env))
    removed: list[str] = []
    if process_start(os.getpid()) is None:
        return removed  # no /proc: no telling a live task from a dead one
    try:
        entries = [entry.name for entry in os.scandir(base)]
    except OSError:
        return removed
    for name in entries:
        found = _NAME.fullmatch(name)
        if found is None or found["kind"] != kind or found["host"] != _host():
            continue
        if process_start(int(found["pid"])) == int(found["start"]):
            continue  # its task still runs
        path = os.path.join(base, name)
        if remove_owned(path) == "removed":
            removed.append(path)
    return removed


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64] or "host"


def create(path: Path) -> Path:
    """Make the planned folder, this user's only (mode 0700); raises ``FileExistsError`` if the name is taken."""
    os.mkdir(path, 0o700)
    return path


def remove_owned(path: str | Path, *, uid: int | None = None) -> str:
    """Remove ``path`` if it is still what :func:`create` made; what happened, in a few words (for a log).

    Never follows a symlink: the folder is opened relative to its checked
    parent, and ``shutil.rmtree`` with ``dir_fd`` removes it without leaving it.
    """
    uid = os.geteuid() if uid is None else uid
    path = str(path)
    parent, name = os.path.split(path)
    if not os.path.isabs(path) or not name.startswith(PREFIX) or os.path.realpath(parent) != parent:
        return "refused: not an absolute hpctrain-* path without symlinks"
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return f"not removed: {exc.strerror}"
    try:
        try:
            st = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return "already gone"
        except OSError as exc:
            return f"not removed: {exc.strerror}"
        if not stat.S_ISDIR(st.st_mode):
            return "refused: not a directory (a symlink or a file)"
        if st.st_uid != uid:
            return f"refused: owned by uid {st.st_uid}, not {uid}"
        failed: list[str] = []
        shutil.rmtree(name, dir_fd=parent_fd, onerror=lambda *args: failed.append(str(args[2][1])))
        return f"partly removed: {failed[0]}" if failed else "removed"
    finally:
        os.close(parent_fd)
