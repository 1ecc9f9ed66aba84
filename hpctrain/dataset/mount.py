"""A packed dataset image, made readable once per node for the node's tasks, and released after them.

The node's first task (local rank 0, the leader) unmounts what a previous
attempt of the job left mounted, copies the image to node-local disk first
with ``data.stage: node`` (one sequential read, resumed after a requeue),
mounts it with ``squashfuse -f`` (no root needed) at
``<stage dir>/hpctrain-image-<job>/mnt-<attempt>``, and writes
``READY-<attempt>``; the node's other tasks wait for that marker (or for
``FAILED-<attempt>``, whose message they raise too), as in ``staging``.
Every task that reads the mount registers its PID under ``users/``.

Release, first: every task that ends in any way it can still act (done, a
stop for a requeue, an exception, the hang watchdog) calls :func:`leave`,
which removes its registration under a lock and, for the node's last task,
stops squashfuse and unmounts (``fusermount3 -u``, ``fusermount -u``, or
``umount`` as root; lazily if busy) before the task exits. It must happen
then: when a step's tasks have ended, Slurm (proctrack/cgroup) kills whatever
else the step started at once, squashfuse included, which would leave a dead
FUSE mount ("Transport endpoint is not connected") behind.

Release, second: the leader also starts a detached watcher (``runtime.cleanup``'s,
with ``--unmount``) for tasks that cannot act (SIGKILL): it waits for the
leader and every registered task to be gone, then releases the mount. It
ignores the job's SIGTERM, but a cgroup kill of the whole step ends it too;
then the next attempt of the job on that node unmounts the stale mount first.
squashfuse runs without the task token, so the task reaper does not stop it
under the other tasks.

torch-free and stdlib-only, apart from psutil (which the reaper uses already).
"""

from __future__ import annotations

import fcntl
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

from hpctrain.dataset.squashfs import ImageError, read_superblock, require_tool

MOUNT_TIMEOUT_S = 60.0
UNMOUNT_TRIES = 5
COPY_CHUNK = 16 * 2**20
# Who started us, by table: the job id and attempt of each launcher (see runtime/task_env.py).
JOB_VARS = (
    ("SLURM_JOB_ID", "SLURM_RESTART_COUNT"),
    ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"),
    ("SUBMITIT_LOCAL_JOB_ID", None),
)


_JOINED: list[tuple[Path, Path]] = []  # (base, READY marker) of each mount this process registered for


@dataclass(frozen=True)
class Mounted:
    """A mounted image: where its tree is, and the squashfuse process serving it."""

    image: Path
    point: Path
    daemon_pid: int


def attempt_names(environ: Mapping[str, str]) -> tuple[str, str]:
    """(job, attempt) naming this run's mount: array tasks and requeued attempts never share one."""
    for job_var, restart_var in JOB_VARS:
        if environ.get(job_var):
            job = re.sub(r"[^A-Za-z0-9_.-]", "_", environ[job_var])[:64]
            return job, environ.get(restart_var or "", "0") or "0"
    return f"pid{os.getpid()}", "0"


def mount_dir(stage_dir: Path, environ: Mapping[str, str]) -> tuple[Path, str]:
    job, attempt = attempt_names(environ)
    return stage_dir / f"hpctrain-image-{job}", attempt


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
    image, stage_dir = image.resolve(), stage_dir.absolute()  # squashfuse and the watcher run in /
    base, attempt = mount_dir(stage_dir, environ)
    ready, failed = base / f"READY-{attempt}", base / f"FAILED-{attempt}"
    if is_node_leader:
        try:
            register_user(base, os.getpid())  # before the mount exists: the watcher waits for every user
            mounted = _mount_as_leader(image, stage_dir, base, attempt, stage, log)
            _write_json(ready, {"point": str(mounted.point), "pid": mounted.daemon_pid, "image": str(mounted.image)})
            _JOINED.append((base, ready))
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
        register_user(base, os.getpid())
    except OSError as exc:
        raise _as_image_error(exc, stage_dir) from exc
    point = Path(_wait(ready, failed, timeout_s)["point"])
    _JOINED.append((base, ready))
    return point


def leave(log: Callable[[str], None] | None = None) -> None:
    """This task is done with the node's mount: unregister, and release it if no other task still uses it.

    Never raises: a task's end must not fail on its clean-up (the watcher remains).
    """
    log = log or _print
    while _JOINED:
        base, ready = _JOINED.pop()
        try:
            with _users_lock(base):
                _user_entry(base, os.getpid()).unlink(missing_ok=True)
                if live_users(base / "users"):
                    continue
                marker = json.loads(ready.read_text())
                point, pid = Path(marker["point"]), marker.get("pid")
                if is_mounted(point):
                    gone = release(point, pid if isinstance(pid, int) else None)
                    what = "unmounted" if gone else "could not unmount"
                    log(f"hpctrain: data: {what} {point} (the node's last task to end)")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log(f"hpctrain: data: could not release the dataset mount under {base}: {exc} (the watcher will)")


def _as_image_error(exc: BaseException, stage_dir: Path) -> ImageError:
    if isinstance(exc, ImageError):
        return exc
    if isinstance(exc, OSError):
        return ImageError(
            f"cannot mount under {stage_dir}: {exc.strerror or exc}",
            "set data.stage_dir to a writable node-local folder",
        )
    return ImageError(f"{type(exc).__name__}: {exc}", "see the log of the node's first task")


def register_user(base: Path, pid: int) -> None:
    (base / "users").mkdir(parents=True, exist_ok=True)
    with _users_lock(base):
        _user_entry(base, pid).touch()


def _user_entry(base: Path, pid: int) -> Path:
    return base / "users" / f"{pid}-{_start_time(pid)}"


class _users_lock:  # noqa: N801 (used like a function: ``with _users_lock(base):``)
    """An exclusive lock over the node's user registrations (the last one to leave releases the mount)."""

    def __init__(self, base: Path) -> None:
        self.path = base / "users.lock"

    def __enter__(self) -> None:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
        if pid.isdigit() and started and _start_time(int(pid)) == started:
            alive.append(int(pid))
    return alive


# ------------------------------------------------------------------ the leader


def _mount_as_leader(image: Path, stage_dir: Path, base: Path, attempt: str, stage: bool, log) -> Mounted:
    squashfuse = require_tool("squashfuse")
    if not os.path.exists("/dev/fuse"):
        raise ImageError(
            "/dev/fuse does not exist on this node: it cannot mount the dataset image",
            "use a node with FUSE, run the job in Apptainer, or set data.root to the unpacked folder",
        )
    read_superblock(image)
    base.mkdir(parents=True, exist_ok=True)
    for stale in sorted(base.glob("mnt-*")):
        if is_mounted(stale):
            log(f"hpctrain: data: unmounting {stale}, left mounted by an earlier attempt")
            release(stale, None)
    for marker in (base / f"READY-{attempt}", base / f"FAILED-{attempt}"):
        marker.unlink(missing_ok=True)
    if stage:
        image = copy_image(image, stage_dir, log)
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
    from hpctrain.runtime.cleanup import TOKEN_ENV

    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    env["HPCTRAIN_IMAGE_MOUNT"] = str(point)  # never the environment of a task (see runtime.cleanup's watch)
    log_path = point.parent / f"{point.name}.log"
    with open(log_path, "ab") as err:
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
    from hpctrain.runtime.cleanup import TOKEN_ENV, new_token, start_reaper

    # This watcher reaps nothing, so it needs no token of its own; setting one in os.environ (where
    # the process has none, e.g. a trainer run in-process) would hand it to every later child.
    token = os.environ.get(TOKEN_ENV) or new_token()
    try:
        start_reaper(
            token,
            unmount=mounted.point,
            daemon_pid=mounted.daemon_pid,
            users_dir=base / "users",
            log_path=base / f"{mounted.point.name}.watch.log",
        )
    except (RuntimeError, OSError) as exc:
        release(mounted.point, mounted.daemon_pid)
        raise ImageError(
            f"could not start the watcher that unmounts {mounted.point} after the job: {exc}",
            "see the node's log; set data.root to the unpacked folder meanwhile",
        ) from exc


def copy_image(image: Path, stage_dir: Path, log) -> Path:
    """The image, copied once to ``stage_dir`` (kept for requeues; a cut-off copy is resumed)."""
    info = image.stat()
    key = f"{image.name}-{info.st_size}-{info.st_mtime_ns}"
    dest = stage_dir / f"hpctrain-{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}"
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
    with open(image, "rb") as src, open(part, "r+b" if done else "wb") as dst:
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


# ------------------------------------------------------------------ release (the watcher)


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


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _wait(ready: Path, failed: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        for marker, is_error in ((ready, False), (failed, True)):
            try:
                info = json.loads(marker.read_text())
            except (OSError, ValueError):
                continue
            if is_error:
                raise ImageError(info.get("message", "the node's first task could not mount the image"), info["hint"])
            return info
        if time.monotonic() > deadline:
            raise ImageError(
                f"data.root: waited {timeout_s:.0f} s for the node's mount ({ready} never appeared)",
                "check the log of the node's first task (local rank 0)",
            )
        time.sleep(0.2)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _tail(path: Path) -> str:
    try:
        return " / ".join(path.read_text(errors="replace").strip().splitlines()[-2:])[:300]
    except OSError:
        return ""


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
