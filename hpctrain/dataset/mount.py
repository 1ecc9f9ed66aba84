"""A packed dataset image, made readable once per node for the node's tasks, and released after them.

The node's first task (local rank 0, the leader) unmounts what a previous
attempt of the job left mounted, copies the image to node-local disk first
with ``data.stage: node`` (one sequential read, resumed after a requeue),
mounts it with ``squashfuse -f`` (no root needed) at ``mnt-<attempt>`` in
the job's folder on the node (``node_folder``: ``<stage dir>/hpctrain-<uid>/
job-<job>/``, this user's alone), and writes ``READY-<attempt>``; the node's
other tasks wait for that marker (or for ``FAILED-<attempt>``, whose message
they raise too), as in ``staging``. Every task that reads the mount
registers its PID under ``users/``.

Release, first: every task that ends in any way it can still act (done, a
stop for a requeue, an exception, the hang watchdog) calls
``node_folder.leave``, which removes its registration under a lock and, for
the node's last task, stops squashfuse and unmounts (``fusermount3 -u``, ``fusermount -u``, or
``umount`` as root; lazily if busy) before the task exits. It must happen
then: when a step's tasks have ended, Slurm (proctrack/cgroup) kills whatever
else the step started at once, squashfuse included, which would leave a dead
FUSE mount ("Transport endpoint is not connected") behind.

Release, second: the leader also starts a detached watcher (``dataset/mount_release.py``,
the reaper's kind) for tasks that cannot act (SIGKILL): it waits for the
leader and every registered task to be gone, then releases the mount. It
ignores the job's SIGTERM, but a cgroup kill of the whole step ends it too;
then the next attempt of the job on that node unmounts the stale mount first.
squashfuse runs without the task token, so the task reaper does not stop it
under the other tasks.

torch-free and stdlib-only, apart from psutil (which the reaper uses already).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract.file_writes import open_append, open_resumable, write_atomic
from hpctrain.contract.process_tokens import TOKEN_ENV
from hpctrain.contract.runfiles import RunFileError, load_json, read_bounded, real_path
from hpctrain.dataset import node_folder
from hpctrain.dataset.mount_release import is_mounted, release, start_watcher
from hpctrain.dataset.squashfs import ImageError, read_superblock, require_tool

MOUNT_TIMEOUT_S = 60.0
COPY_CHUNK = 16 * 2**20


@dataclass(frozen=True)
class Mounted:
    """A mounted image: where its tree is, and the squashfuse process serving it."""

    image: Path
    point: Path
    daemon_pid: int


def open_image(
    image: Path,
    stage_dir: Path,
    *,
    is_node_leader: bool,
    stage: bool,
    environ: Mapping[str, str] = os.environ,
    timeout_s: float = 6 * 3600,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The folder where this node's tasks read ``image``'s tree (mounting it on the leader).

    Raises ``ImageError`` on every task of the node when the leader cannot mount it.
    """
    log = log or _print
    image, stage_dir = real_path(image), stage_dir.absolute()  # squashfuse and the watcher run in /
    try:
        base, attempt = node_folder.job_folder(stage_dir, environ, sweep=is_node_leader)
    except (OSError, node_folder.NodeFolderError) as exc:
        raise _as_image_error(exc, stage_dir) from None
    ready, failed = base / f"READY-{attempt}", base / f"FAILED-{attempt}"
    if is_node_leader:
        try:
            node_folder.join(base)  # before the mount exists: the watcher waits for every user
            mounted = _mount_as_leader(image, base, attempt, stage, log)
            _write_json(ready, {"point": str(mounted.point), "pid": mounted.daemon_pid, "image": str(mounted.image)})
        except BaseException as exc:
            error = _as_image_error(exc, stage_dir)
            try:
                _write_json(failed, {"message": error.message, "hint": error.hint})
            except OSError:
                pass
            if error is exc or not isinstance(exc, OSError):
                raise
            raise error from exc
        return mounted.point
    try:
        node_folder.join(base)
    except OSError as exc:
        raise _as_image_error(exc, stage_dir) from exc
    return Path(_wait(ready, failed, timeout_s)["point"])


def leave(log: Callable[[str], None] | None = None, *, keep: bool = True) -> None:
    """This task is done with the node's mount (``node_folder.leave``: the node's last task unmounts)."""
    node_folder.leave(keep=keep, log=log)


def _as_image_error(exc: BaseException, stage_dir: Path) -> ImageError:
    if isinstance(exc, ImageError):
        return exc
    if isinstance(exc, node_folder.NodeFolderError):
        return ImageError(exc.message, exc.hint)
    if isinstance(exc, OSError):
        return ImageError(
            f"cannot mount under {stage_dir}: {exc.strerror or exc}",
            "set data.stage_dir to a writable node-local folder",
        )
    return ImageError(f"{type(exc).__name__}: {exc}", "see the log of the node's first task")


# ------------------------------------------------------------------ the leader


def _mount_as_leader(image: Path, base: Path, attempt: str, stage: bool, log) -> Mounted:
    squashfuse = require_tool("squashfuse")
    if not os.path.exists("/dev/fuse"):
        raise ImageError(
            "/dev/fuse does not exist on this node: it cannot mount the dataset image",
            "use a node with FUSE, run the job in Apptainer, or set data.root to the unpacked folder",
        )
    read_superblock(image)
    for stale in sorted(base.glob("mnt-*")):
        if is_mounted(stale):
            log(f"hpctrain: data: unmounting {stale}, left mounted by an earlier attempt")
            release(stale, None)
    for marker in (base / f"READY-{attempt}", base / f"FAILED-{attempt}"):
        marker.unlink(missing_ok=True)
    if stage:
        image = copy_image(image, base, log)
    point = base / f"mnt-{attempt}"
    point.mkdir(exist_ok=True)
    if any(point.iterdir()):
        raise ImageError(
            f"the mount point {point} is busy (not empty, and not a mount of ours)",
            f"remove what is in {point}, or set data.stage_dir elsewhere",
        )
    mounted = _start_squashfuse(squashfuse, image, point)
    try:
        os.listdir(point)  # squashfuse mounts an image whose directories are damaged; its listing fails
    except OSError as exc:
        release(point, mounted.daemon_pid)
        raise ImageError(
            f"{image} is corrupt: its top folder cannot be read once mounted ({exc.strerror})",
            "copy the image again from where it was packed (the copy was damaged), or pack it again",
        ) from None
    _start_watcher(base, mounted)
    log(f"hpctrain: data: mounted {image} at {point} (squashfuse pid {mounted.daemon_pid})")
    return mounted


def _start_squashfuse(squashfuse: str, image: Path, point: Path) -> Mounted:
    """``squashfuse -f`` in its own session, without the task token (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["HPCTRAIN_IMAGE_MOUNT"] = str(point)  # never the environment of a task (see runtime/cleanup.py's watch)
    log_path = point.parent / f"{point.name}.log"
    with os.fdopen(open_append(log_path), "ab") as err:
        proc = subprocess.Popen(
            [squashfuse, "-f", str(image), str(point)],
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=err,
            env=env,
            cwd="/",
            start_new_session=True,
            close_fds=True,
        )
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not is_mounted(point):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            why = _tail(log_path) or f"exit {proc.returncode}"
            raise ImageError(
                f"squashfuse could not mount {image} at {point}: {why}",
                "check that FUSE works on this node (`squashfuse IMAGE DIR` by hand), or set data.stage: node; "
                "a corrupt image fails so too (`unsquashfs -l IMAGE` says; copy it again)",
            )
        time.sleep(0.05)
    return Mounted(image, point, proc.pid)


def _start_watcher(base: Path, mounted: Mounted) -> None:
    try:
        start_watcher(base, mounted.point, mounted.daemon_pid)
    except (RuntimeError, OSError) as exc:
        release(mounted.point, mounted.daemon_pid)
        raise ImageError(
            f"could not start the watcher that unmounts {mounted.point} after the job: {exc}",
            "see the node's log; set data.root to the unpacked folder meanwhile",
        ) from exc


def copy_image(image: Path, stage_dir: Path, log) -> Path:
    """The image, copied once into ``stage_dir`` (the job's node folder: kept for requeues; a cut-off copy
    is resumed). Named by the image's name, size and mtime: a changed image is copied anew."""
    info = image.stat()
    key = f"{image.name}-{info.st_size}-{info.st_mtime_ns}"
    dest = stage_dir / f"image-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}"
    if dest.is_file() and dest.stat().st_size == info.st_size:
        log(f"hpctrain: data: image staged already at {dest}")
        return dest
    part = dest.with_name(dest.name + ".part")
    done = part.stat().st_size if part.is_file() else 0
    done = done if done <= info.st_size else 0
    free = shutil.disk_usage(stage_dir).free
    if info.st_size - done > free:
        raise ImageError(
            f"data.stage: {stage_dir} has {free / 2**30:.1f} GiB free, the image needs "
            f"{(info.st_size - done) / 2**30:.1f} GiB more",
            "set data.stage_dir to a larger node-local disk, or data.stage: none to mount it in place",
        )
    log(f"hpctrain: data: copying {image} ({info.st_size / 2**20:.0f} MiB, from byte {done}) to {dest}")
    started = time.perf_counter()
    with open(image, "rb") as src, os.fdopen(open_resumable(part), "r+b") as dst:
        src.seek(done)
        dst.seek(done)
        dst.truncate(done)
        while chunk := src.read(COPY_CHUNK):
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    if part.stat().st_size != info.st_size:
        raise ImageError(f"data.stage: the copy of {image} came out short", "the image changed while copying?")
    os.replace(part, dest)
    seconds = max(1e-9, time.perf_counter() - started)
    log(f"hpctrain: data: staged the image in {seconds:.1f} s ({(info.st_size - done) / 2**20 / seconds:.0f} MB/s)")
    return dest


def _wait(ready: Path, failed: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        for marker, is_error in ((ready, False), (failed, True)):
            try:
                info = load_json(read_bounded(marker, 1 << 16))
            except (OSError, ValueError, RunFileError):
                continue
            if not isinstance(info, dict):
                continue
            if is_error:
                message = info.get("message") or "the node's first task could not mount the image"
                raise ImageError(str(message), str(info.get("hint") or "see the log of the node's first task"))
            return info
        if time.monotonic() > deadline:
            raise ImageError(
                f"data.root: waited {timeout_s:.0f} s for the node's mount ({ready} never appeared)",
                "check the log of the node's first task (local rank 0)",
            )
        time.sleep(0.2)


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data))


def _tail(path: Path) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-2:])[:300]
    except OSError:
        return ""


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
