"""A job's folder on a node's disk (``data.stage_dir``): this user's alone, shared by the job's tasks there.

Node-local disks (``/tmp``, ``$TMPDIR``, scratch) are written by every user
of the node, and every name hpctrain used there followed from public facts
(a job id, a dataset's path): another user could plant a stage copy that a
job then trained on, or the folder a mount goes in. So everything hpctrain
keeps on a node lives under one folder of the user's own::

    <stage dir>/hpctrain-<uid>/        mode 0700: created exclusively, or used only when it is
                                       a real folder (no link) of this user that no one else can write
        job-<job id>/                  one per job (array task); its requeued attempts reuse it
            copy/                      data.stage: node of a folder (trainer/data/staging.py)
            image-<key>.sqsh           data.stage: node of a packed image (mount.copy_image)
            mnt-<attempt>/, READY-...  the image's mount (mount)
            users/, users.lock         the job's tasks on this node that use the folder

The stage dir itself must exist: it is never created (a typo in
``data.stage_dir``, or a ``$SLURM_TMPDIR`` leaked from a job that has ended,
would otherwise grow a tree that nobody removes). Without ``data.stage_dir``
it is the first existing folder of ``$SLURM_TMPDIR``, ``$TMPDIR`` and ``/tmp``.

The node's last task of the job to leave releases the mount and, when the
run ended normally, removes the job's folder with its copies; after a
failure, or when the job stops to be requeued, the folder stays for the
next attempt. A later start of this user's on the node removes job folders
that no live task uses and that have not changed for ``SWEEP_AFTER_S``
(a job killed outright, a requeue that went elsewhere). Torch-free.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpctrain.dataset.node_users import live_users, user_entry, users_lock

# Who started us, by table: the job id and attempt of each launcher (see runtime/task_env.py).
JOB_VARS = (
    ("SLURM_JOB_ID", "SLURM_RESTART_COUNT"),
    ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"),
    ("SUBMITIT_LOCAL_JOB_ID", None),
)
SWEEP_AFTER_S = 3600.0
_JOINED: list[Path] = []  # job folders this process registered in


class NodeFolderError(ValueError):
    """The stage dir is missing, or this user's folder in it is not safely this user's; ``hint`` is the fix."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


def attempt_names(environ: Mapping[str, str]) -> tuple[str, str]:
    """(job, attempt): array tasks and jobs never share a folder, requeued attempts never a mount."""
    for job_var, restart_var in JOB_VARS:
        if environ.get(job_var):
            job = re.sub(r"[^A-Za-z0-9_.-]", "_", environ[job_var])[:64]
            return job, environ.get(restart_var or "", "0") or "0"
    return f"pid{os.getpid()}", "0"


def job_folder(stage_dir: Path, environ: Mapping[str, str], *, sweep: bool = False) -> tuple[Path, str]:
    """(this job's folder on the node, the attempt), the user's folder checked or made; ``sweep``: the
    node's leader also removes stale job folders of this user's (module docstring)."""
    mine = user_folder(stage_dir)
    job, attempt = attempt_names(environ)
    folder = mine / f"job-{job}"
    if sweep:
        sweep_stale(mine, keep=folder)
    folder.mkdir(exist_ok=True)
    (folder / "users").mkdir(exist_ok=True)
    return folder, attempt


def user_folder(stage_dir: Path, uid: int | None = None) -> Path:
    """``stage_dir/hpctrain-<uid>``: made exclusively (0700), or checked to be safely this user's."""
    uid = os.geteuid() if uid is None else uid
    if not stage_dir.is_dir():
        raise NodeFolderError(
            f"data.stage_dir: {stage_dir} does not exist on node {_node()}",
            "set data.stage_dir to a node-local folder that exists on every node (it is never created), "
            "or leave it unset for $SLURM_TMPDIR, $TMPDIR or /tmp",
        )
    mine = stage_dir / f"hpctrain-{uid}"
    try:
        mine.mkdir(mode=0o700)
        return mine
    except FileExistsError:
        pass
    info = os.lstat(mine)
    problem = None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder (a link, or a file)"
    elif info.st_uid != uid:
        problem = f"belongs to user {info.st_uid}, not to you ({uid})"
    elif info.st_mode & 0o022:
        problem = f"can be written by others (mode {stat.S_IMODE(info.st_mode):o})"
    if problem:
        raise NodeFolderError(
            f"{mine} {problem}: someone else could put a dataset copy or a mount there; not used",
            "remove it (or ask the node's admins to), or set data.stage_dir to a folder of your own",
        )
    return mine


def join(folder: Path, pid: int | None = None) -> None:
    """Register this task (``pid``) as a user of the job's folder on this node."""
    pid = os.getpid() if pid is None else pid
    (folder / "users").mkdir(parents=True, exist_ok=True)
    with users_lock(folder):
        user_entry(folder, pid).touch()
    if folder not in _JOINED:
        _JOINED.append(folder)


def leave(*, keep: bool = True, log: Callable[[str], None] | None = None) -> None:
    """This task is done with its job's folders: unregister; the node's last task releases the mount and,
    unless ``keep`` (a requeue or a failure may come back), removes the folder. Never raises."""
    log = log or _print
    while _JOINED:
        folder = _JOINED.pop()
        try:
            with users_lock(folder):
                user_entry(folder, os.getpid()).unlink(missing_ok=True)
                if live_users(folder / "users"):
                    continue
                release_mounts(folder, log)
                if not keep:
                    shutil.rmtree(folder, ignore_errors=True)
                    log(f"hpctrain: data: removed {folder} (the run has ended)")
        except OSError as exc:
            log(f"hpctrain: data: could not release {folder}: {exc} (the watcher will)")


def release_mounts(folder: Path, log: Callable[[str], None]) -> None:
    """Unmount what the job mounted in ``folder`` (the node's last task to end: see ``mount``)."""
    if not any(folder.glob("mnt-*")):
        return
    from hpctrain.dataset import mount_release  # imported only to release

    for point in sorted(folder.glob("mnt-*")):
        if mount_release.is_mounted(point):
            gone = mount_release.release(point, mount_release.daemon_of(folder, point))
            log(f"hpctrain: data: {'unmounted' if gone else 'could not unmount'} {point} (the node's last task to end)")


def sweep_stale(mine: Path, keep: Path, *, now: float | None = None) -> list[Path]:
    """Remove this user's job folders that no live task uses and that have not changed for ``SWEEP_AFTER_S``."""
    now = time.time() if now is None else now
    removed = []
    try:
        folders = [f for f in mine.iterdir() if f.name.startswith("job-") and f != keep]
    except OSError:
        return removed
    for folder in folders:
        try:
            if live_users(folder / "users") or now - folder.stat().st_mtime < SWEEP_AFTER_S:
                continue
            release_mounts(folder, lambda line: None)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except OSError:
            continue
    return removed


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
