"""Node-local staging: one task per node copies the dataset to local disk, the others wait, all read it.

``data.stage: node`` turns a shared-filesystem dataset (GPFS, Lustre, NFS) into
a per-node copy: the node's local rank 0 copies the files of the shared index
(train and val) with parallel readers into ``copy/`` of the job's folder on
the node (``node_folder``: ``<stage_dir>/hpctrain-<uid>/job-<job>/``, this
user's alone, so no one else can plant a copy there), checks the free space
first, and writes ``STAGED`` last, naming the copy's key (a digest of the
source and every sample's path and label); the node's other tasks wait for
that marker (or for ``FAILED``, whose message they raise too). A requeued
attempt finds the marker with its key and skips the copy; a half-done copy
of the same key is resumed (files already there with the right size are
kept), one of another key (the dataset changed) is removed first. The node's
last task removes the copy when the run ends normally (``node_folder``).

``data.stage_dir`` may name the node (``{node}``) and use environment
variables; it must exist (it is never created); default: the first existing
of ``$SLURM_TMPDIR``, ``$TMPDIR`` and ``/tmp``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hpctrain.contract.file_writes import copy_atomic, write_atomic
from hpctrain.contract.runfiles import RunFileError, load_json, read_bounded, real_path
from hpctrain.dataset import node_folder
from hpctrain.errors import TrainingConfigError
from hpctrain.runtime.node_dirs import temp_dir
from hpctrain.trainer.data.index import DatasetIndex

DONE, FAILED, KEY = "STAGED", "FAILED", "KEY"
HEADROOM = 1.05  # keep 5% of the needed space spare (filesystem overhead, other users)


def node_name(env: Mapping[str, str]) -> str:
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def resolve_stage_dir(
    template: str | None, env: Mapping[str, str], exists: Callable[[str], bool] = os.path.isdir
) -> Path:
    """The node's staging folder: ``{node}`` and ``$VARS`` expanded; default: the first of $SLURM_TMPDIR,
    $TMPDIR and /tmp that ``exists`` (a variable naming a folder that is gone, e.g. leaked from a job that
    has ended, is passed over rather than created)."""
    if not template:
        template = temp_dir(env, exists)
    expanded = template.replace("{node}", node_name(env))
    for name, value in sorted(env.items(), key=lambda kv: -len(kv[0])):
        expanded = expanded.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return Path(expanded).expanduser()


def stage_key(source_root: Path, indices: Sequence[tuple[str, DatasetIndex]]) -> str:
    """A digest of the source and of every sample's path and label: another dataset gets another copy."""
    digest = hashlib.sha256(str(real_path(source_root)).encode(errors="surrogateescape"))
    for split, index in indices:
        digest.update(f"\0{split}\0{len(index.samples)}".encode(errors="surrogateescape"))
        for rel, label in index.samples:
            digest.update(f"\0{rel}\0{label}".encode(errors="surrogateescape"))
    return digest.hexdigest()[:32]


def stage_dataset(
    source_root: Path,
    indices: Sequence[tuple[str, DatasetIndex]],
    stage_dir: Path,
    *,
    is_node_leader: bool,
    readers: int = 8,
    timeout_s: float = 6 * 3600,
    log=None,
    environ: Mapping[str, str] = os.environ,
) -> Path:
    """Copy ``indices`` (``(split folder, index)`` pairs) into the job's folder in ``stage_dir``; the staged root.

    Raises ``TrainingConfigError`` when the stage dir is missing or not safely this user's, or the
    local disk is too small, on every task of the node.
    """
    try:
        folder, _ = node_folder.job_folder(stage_dir, environ, sweep=is_node_leader)
        node_folder.join(folder)
    except node_folder.NodeFolderError as exc:
        raise TrainingConfigError(exc.message, hint=exc.hint) from None
    except OSError as exc:
        raise TrainingConfigError(
            f"data.stage: cannot write in {stage_dir}: {exc.strerror or exc}",
            hint="set data.stage_dir to a writable node-local folder",
        ) from None
    dest, key = folder / "copy", stage_key(source_root, indices)
    if is_node_leader:
        _copy(source_root, indices, dest, key, readers, log or _print)
    else:
        _wait(dest, key, timeout_s)
    return dest


def staged_index(index: DatasetIndex, staged_split: Path) -> DatasetIndex:
    """The same samples, read from the staged copy."""
    return DatasetIndex(str(staged_split), index.classes, index.samples, index.empty_classes)


def _copy(
    source_root: Path, indices: Sequence[tuple[str, DatasetIndex]], dest: Path, key: str, readers: int, log
) -> None:
    if _marker(dest / DONE).get("key") == key:
        log(f"hpctrain: data staged already in {dest} (complete copy found; not copying again)")
        return
    try:
        if _marker(dest / KEY).get("key") != key:  # another dataset's copy, or none: start afresh
            shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(exist_ok=True)
        (dest / DONE).unlink(missing_ok=True)
        (dest / FAILED).unlink(missing_ok=True)
        write_atomic(dest / KEY, json.dumps({"key": key}))
        listed = [(Path(idx.root) / rel, dest / split / rel) for split, idx in indices for rel, _ in idx.samples]
        with ThreadPoolExecutor(readers) as pool:
            sizes = list(pool.map(lambda job: _regular_size(job[0]), listed))
        jobs = [job for job, size in zip(listed, sizes, strict=True) if size is not None]
        sizes = [size for size in sizes if size is not None]
        if len(jobs) < len(listed):  # a FIFO or /dev/zero named x.jpg would block or fill the disk
            log(
                f"hpctrain: not staging {len(listed) - len(jobs)} entries that are not readable regular files "
                "(FIFOs, devices, broken links); training skips and counts them"
            )
        total = sum(sizes)
        pending = [(job, size) for job, size in zip(jobs, sizes, strict=True) if not _same_size(job[1], size)]
        needed = sum(size for _, size in pending)
        free = shutil.disk_usage(dest).free
        if needed * HEADROOM > free:
            raise TrainingConfigError(
                f"data.stage: {dest} has {free / 2**30:.1f} GiB free, the dataset needs {needed / 2**30:.1f} GiB "
                f"more (+5% headroom) on node {node_name(os.environ)}",
                hint="set data.stage_dir to a larger node-local disk, stage less data, or set data.stage: none",
            )
        log(f"hpctrain: staging {len(jobs)} files ({total / 2**20:.0f} MB, {len(pending)} to copy) to {dest}")
        started = time.perf_counter()
        with ThreadPoolExecutor(readers) as pool:
            list(pool.map(lambda item: _copy_file(*item[0]), pending))
        seconds = max(1e-9, time.perf_counter() - started)
        rate = needed / 2**20 / seconds
        log(f"hpctrain: staged {needed / 2**20:.0f} MB in {seconds:.1f} s ({rate:.0f} MB/s, {readers} readers)")
        done = {"source": str(source_root), "files": len(jobs), "bytes": total, "key": key}
        write_atomic(dest / DONE, json.dumps(done))
    except BaseException as exc:
        message = exc.message if isinstance(exc, TrainingConfigError) else f"{type(exc).__name__}: {exc}"
        hint = exc.hint if isinstance(exc, TrainingConfigError) else "see the node leader's log"
        try:
            write_atomic(dest / FAILED, json.dumps({"message": message, "hint": hint}))
        except OSError:
            pass
        raise


def _print(line: str) -> None:
    print(line, flush=True)


def _regular_size(path: Path) -> int | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def _same_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    copy_atomic(src, dst)  # a file is complete or absent: a resumed copy can trust sizes


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _marker(path: Path) -> dict:
    """A marker of the copy (STAGED, KEY, FAILED), or {} when it is missing or unreadable."""
    try:
        info = load_json(read_bounded(path, 1 << 16))
    except (OSError, ValueError, RunFileError):
        return {}
    return info if isinstance(info, dict) else {}


def _wait(dest: Path, key: str, timeout_s: float) -> None:
    deadline, started = time.monotonic() + timeout_s, time.time() - 5
    while _marker(dest / DONE).get("key") != key:
        if _mtime(dest / FAILED) > started:  # an older FAILED is a previous attempt's
            info = _marker(dest / FAILED)
            message = str(info.get("message") or "the node's staging task failed")
            raise TrainingConfigError(message, hint=str(info.get("hint") or "see the log of the node's first task"))
        if time.monotonic() > deadline:
            raise TrainingConfigError(
                f"data.stage: waited {timeout_s:.0f} s for the node's copy in {dest}",
                hint="check the log of the node's first task (local rank 0)",
            )
        time.sleep(0.5)
