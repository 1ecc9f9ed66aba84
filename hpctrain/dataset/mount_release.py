"""Releasing a node's dataset mount after its tasks: the unmount, and the watcher.

Every task that reads a node's mount (``hpctrain.dataset.mount``) registers
its PID and start time under the job's node folder's ``users/``
(``dataset/node_users.py``); the last one to leave releases the mount.
For tasks that cannot act (SIGKILL), the node's first task starts a
detached watcher, ``python -m hpctrain.dataset.mount_release``, the reaper's
kind (``runtime/cleanup.py``'s :func:`~hpctrain.runtime.cleanup.start_detached`):
once that task and every registered one are gone it stops the squashfuse
(only if its PID is still squashfuse on that point) and unmounts. It ignores
the job's SIGTERM and reaps nothing (each task's own watcher does).

torch-free and stdlib-only, apart from psutil.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hpctrain.contract.process_tokens import TOKEN_ENV, alive, new_token
from hpctrain.contract.runfiles import RunFileError, load_json, read_bounded
from hpctrain.dataset.node_users import live_users
from hpctrain.runtime.cleanup import begin_watching, reaper_environ, start_detached

MODULE = "hpctrain.dataset.mount_release"
UNMOUNT_TRIES = 5
POLL_S = 0.5


# ------------------------------------------------------------------ release


def release(point: Path, daemon_pid: int | None, *, grace_s: float = 5.0, log=None) -> bool:
    """Stop squashfuse (only if ``daemon_pid`` is still squashfuse on ``point``) and unmount; True when gone."""
    log = log or (lambda line: None)
    if daemon_pid is not None and _is_our_daemon(daemon_pid, point):
        import psutil

        try:
            proc = psutil.Process(daemon_pid)
            proc.terminate()  # squashfuse unmounts itself on SIGTERM
            deadline = time.monotonic() + grace_s
            while proc.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    if is_mounted(point):
        unmount(point)
    try:
        point.rmdir()
    except OSError:
        pass
    gone = not is_mounted(point)
    log(f"{point}: {'unmounted' if gone else 'STILL MOUNTED'}")
    return gone


def unmount(point: Path) -> None:
    """Unmount ``point`` (also a stale mount whose daemon died); lazily when it stays busy."""
    commands = [[tool, "-u", str(point)] for tool in ("fusermount3", "fusermount") if shutil.which(tool)]
    if os.geteuid() == 0 and shutil.which("umount"):
        commands.append(["umount", str(point)])
    for attempt in range(UNMOUNT_TRIES):
        for command in commands:
            subprocess.run(command, capture_output=True, check=False)
            if not is_mounted(point):
                return
        time.sleep(0.2 * (attempt + 1))
    for command in commands:  # still busy: detach now, freed when the last file closes
        subprocess.run(command[:1] + ["-uz" if command[0] != "umount" else "-l"] + command[-1:], check=False)
        if not is_mounted(point):
            return


def is_mounted(point: Path, mounts_path: str = "/proc/mounts") -> bool:
    """From the mount table: a stale FUSE mount (its daemon dead) fails ``os.path.ismount``."""
    target = os.path.abspath(point)
    try:
        with open(mounts_path) as handle:
            return any(_unescape(line.split()[1]) == target for line in handle if len(line.split()) > 1)
    except OSError:
        return False


def daemon_of(folder: Path, point: Path) -> int | None:
    """The squashfuse PID a READY marker of ``folder`` records for ``point`` (None: none, or unreadable)."""
    for marker in folder.glob("READY-*"):
        try:
            info = load_json(read_bounded(marker, 4096))
        except (OSError, ValueError, RunFileError):
            continue
        if isinstance(info, dict) and info.get("point") == str(point) and type(info.get("pid")) is int:
            return info["pid"]
    return None


def _is_our_daemon(pid: int, point: Path) -> bool:
    """The PID is a live squashfuse whose command line names ``point`` (never signal anyone else's)."""
    import psutil

    try:
        cmdline = psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return bool(cmdline) and os.path.basename(cmdline[0]) == "squashfuse" and str(point) in cmdline


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


# ------------------------------------------------------------------ the watcher


def start_watcher(base: Path, point: Path, daemon_pid: int) -> int:
    """Start the detached watcher that releases ``point`` once this task and the registered ones are gone;
    its PID. Raises ``RuntimeError`` (or ``OSError``) if it did not start."""
    # It reaps nothing, so it needs no token of its own; setting one in os.environ (where the process has
    # none, e.g. a trainer run in-process) would hand it to every later child.
    token = os.environ.get(TOKEN_ENV) or new_token()
    args = ["--pid", str(os.getpid()), "--unmount", str(point.absolute()), "--daemon-pid", str(daemon_pid)]
    log = base / f"{point.name}.watch.log"
    args += ["--users-dir", str((base / "users").absolute()), "--log", str(log.absolute())]
    return start_detached(MODULE, args, reaper_environ(os.environ, token))


def release_after(
    watched_pid: int,
    point: str,
    daemon_pid: int | None,
    users_dir: str | None,
    *,
    poll_s: float,
    log: Callable[[str], None],
) -> None:
    """Once the task and the mount's other users have ended, unmount. The watcher's main loop."""
    import psutil

    try:
        watched = psutil.Process(watched_pid)
        while alive(watched):
            time.sleep(poll_s)
    except psutil.NoSuchProcess:
        pass
    log(f"task {watched_pid} ended")
    said = False
    while users_dir and (users := live_users(Path(users_dir))):
        if not said:
            log(f"waiting for {len(users)} task(s) still using {point}: {users[:8]}")
            said = True
        time.sleep(poll_s)
    release(Path(point), daemon_pid, log=log)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the node's first task")
    parser.add_argument("--unmount", required=True, help="the dataset image's mount point")
    parser.add_argument("--daemon-pid", type=int, default=None, help="the squashfuse serving --unmount")
    parser.add_argument("--users-dir", default=None, help="tasks registered here must end first")
    parser.add_argument("--poll-s", type=float, default=POLL_S)
    parser.add_argument("--log", default=None, help="append what was done to this file")
    parser.add_argument("--detach", action="store_true", help="fork, print the watcher's PID, exit")
    args = parser.parse_args(argv)
    log = begin_watching(args.log, detached=args.detach)
    log(f"watching task {args.pid}")
    release_after(args.pid, args.unmount, args.daemon_pid, args.users_dir, poll_s=args.poll_s, log=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
