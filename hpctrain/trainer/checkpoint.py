"""Checkpoints that are complete or absent, written without stalling training.

Layout (torchtitan style)::

    checkpoints/step-00001234/state.pt    # torch.save of plain tensors/dicts/lists/numbers/strings
    checkpoints/step-00001234/meta.json   # size + sha256 of state.pt; written last
    checkpoints/best.json                 # pointer to the best step directory (no duplicate copy)

A checkpoint is written into ``.tmp-step-N-<uuid>/``, fsynced, then renamed
into place, so a reader sees the whole directory or nothing; that folder life
(temp folder, meta last, rename, pruning) is ``contract/step_folders.py``'s,
shared with ``hpctrain.task``'s checkpointer. Loading never unpickles
arbitrary objects (``weights_only=True``) and trusts nothing else either, in
this order, before a byte of tensor data is allocated:

1. ``meta.json`` matches ``state.pt`` (size and sha256);
2. the archive is one ``torch.save`` writes (``checkpoint_archive.py``):
   every record stored uncompressed inside the file, the pickle bounded, so
   a 5 MB file cannot inflate into a 5 GiB tensor;
3. the pickle is read onto the ``meta`` device: every field, and every
   tensor's size, with no tensor memory; the caller's ``check`` judges the
   fields (the trainer's: ``trainer/state.py``) and ``max_bytes`` bounds
   what the tensors would take;
4. only then is it read for real.

A checkpoint that fails any step is skipped with a warning naming it and
why, and the previous one is tried; when every checkpoint was skipped, the
load fails with :class:`CheckpointError` listing them (they are kept: a
run that started over would prune them). A load examines at most
``step_folders.MAX_EXAMINED`` folders, and a checkpoints directory that is a
link out of the run is refused, not searched in vain
(``contract/step_folders.py``).

Async saves copy every tensor into reusable CPU staging buffers (the only
time the training loop is blocked, see snapshot.py) and write from a
background thread.
Only global rank 0 saves; every rank loads.
"""

from __future__ import annotations

import logging
import pickle
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hpctrain.contract import checkpoint_listing
from hpctrain.contract.checkpoint_listing import TRAINER_LAYOUT
from hpctrain.contract.file_writes import fsync_path
from hpctrain.contract.rundir import META_FILE, STATE_FILE, step_dir_name
from hpctrain.contract.step_folders import StepFolders, file_digest
from hpctrain.errors import CheckpointError
from hpctrain.trainer.checkpoint_archive import ArchiveError, check_archive, tensor_bytes
from hpctrain.trainer.snapshot import SAFE_SCALARS, StagingBuffers, refuse_type

log = logging.getLogger(__name__)

FORMAT_VERSION = checkpoint_listing.CHECKPOINT_FORMAT_VERSION
# ``check(state, meta)``: judge a checkpoint's fields (its tensors are on the meta device); raise CheckpointError.
Check = Callable[[dict[str, Any], dict[str, Any] | None], None]


class CheckpointManager:
    """Save, find and load checkpoints under one directory."""

    def __init__(self, directory: Path, keep_last: int = 2, keep_best: bool = True, async_save: bool = True) -> None:
        if keep_last < 1:
            raise CheckpointError(f"keep_last must be at least 1 (got {keep_last})", hint="set checkpoint.keep_last")
        self.directory = Path(directory)
        self.folders = StepFolders(self.directory, layout=TRAINER_LAYOUT, keep_last=keep_last, keep_best=keep_best)
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.async_save = async_save
        self.last_loaded: Path | None = None
        self.last_stall_s = 0.0
        self._staging = StagingBuffers()
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None

    # -- public API -------------------------------------------------------------------------------------------
    def save(
        self, state: dict[str, Any], *, step: int, epoch: int, metric: float | None = None, tag: str = "step"
    ) -> Path:
        """Write ``state`` as ``step-<step>/``; return that path (it appears when the write completes).

        With ``async_save`` this blocks only to wait for the previous write and
        to copy tensors into CPU staging buffers; call :meth:`wait` to be sure
        the checkpoint is on disk.
        """
        started = time.perf_counter()
        self.wait()
        info = {"step": int(step), "global_step": int(step), "epoch": int(epoch), "metric": metric, "tag": tag}
        target = self.directory / step_dir_name(step)
        if not self.async_save:
            _check_safe_types(state)
            self._write(state, info)
            self.last_stall_s = time.perf_counter() - started
            return target
        snapshot = self._staging.snapshot(state)
        self._writer = threading.Thread(target=self._write_in_background, args=(snapshot, info), daemon=False)
        self._writer.name = f"checkpoint-writer-{step}"
        self._writer.start()
        self.last_stall_s = time.perf_counter() - started
        return target

    def reserve(self, state: dict[str, Any]) -> None:
        """Allocate staging buffers for a state shaped like ``state`` now, outside the training loop."""
        if self.async_save:
            self.wait()
            self._staging.reserve(state)

    def wait(self) -> None:
        """Block until the background write (if any) is on disk; re-raise its error."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
        error, self._writer_error = self._writer_error, None
        if error is not None:
            raise CheckpointError(
                f"writing a checkpoint under {self.directory} failed: {error}",
                hint="check free space and permissions of the run directory",
            ) from error

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._staging.release()

    def checkpoints(self) -> list[Path]:
        """Step directories with readable meta whose state file has the recorded size, oldest first."""
        return self.folders.checkpoints()

    def latest(self) -> Path | None:
        return self.folders.latest()

    def best(self) -> Path | None:
        return checkpoint_listing.best_checkpoint(self.directory)

    def load(
        self,
        path: Path | None = None,
        map_location: Any = "cpu",
        *,
        check: Check | None = None,
        max_bytes: int | None = None,
        newest: Path | None = None,
        agree: Callable[[bool], bool] | None = None,
    ) -> dict[str, Any] | None:
        """The newest usable checkpoint (or exactly ``path``), tensors placed by ``map_location``
        (``"meta"``: fields only, no tensor memory).

        ``check`` judges its fields and ``max_bytes`` bounds its tensors, both before they are
        allocated (module docstring); ``newest``: start the search there, not at the newest.
        ``agree(usable)`` makes the ranks choose together (collective: True only when every rank could
        use the candidate), so no rank resumes from another checkpoint than the others.
        Checkpoints that fail while searching are skipped with a warning; an explicitly named one
        that fails raises :class:`CheckpointError`, and so does a search that skipped every one.
        Returns None when there is no checkpoint at all.
        """
        if path is not None:
            try:
                state = _load_checkpoint(Path(path), map_location, check=check, max_bytes=max_bytes)
            except (_Corrupt, CheckpointError) as exc:
                why = exc.message if isinstance(exc, CheckpointError) else str(exc)
                raise CheckpointError(
                    f"checkpoint {path}: {why}", hint="load another checkpoint, or none to use the newest usable one"
                ) from exc
            self.last_loaded = Path(path)
            return state
        bound = None if newest is None else checkpoint_listing.folder_step(Path(newest).name)
        skipped = []
        for candidate in self.folders.newest_first(newest=bound):  # at most MAX_EXAMINED folders (step_folders.py)
            state, why = None, None
            try:
                state = _load_checkpoint(candidate, map_location, check=check, max_bytes=max_bytes)
            except (_Corrupt, CheckpointError) as exc:
                kind = "corrupt" if isinstance(exc, _Corrupt) else "unusable"
                why = exc.message if isinstance(exc, CheckpointError) else str(exc)
                log.warning("skipping %s checkpoint %s: %s; trying the previous one", kind, candidate, why)
            if agree is not None and not agree(why is None) and why is None:
                why = "another rank could not use it"
                log.warning("skipping checkpoint %s: %s; trying the previous one", candidate, why)
            if why is not None:
                skipped.append(f"{candidate.name}: {why}")
                continue
            self.last_loaded = candidate
            return state
        if skipped:
            raise CheckpointError(
                f"no usable checkpoint under {self.directory}, so the run cannot resume: " + "; ".join(skipped),
                hint="each was kept; move the damaged ones away (or fix what they name) and resubmit, "
                "or start a new run",
            )
        return None

    # -- writing ---------------------------------------------------------------------------------------------
    def _write_in_background(self, snapshot: dict[str, Any], info: dict[str, Any]) -> None:
        try:
            self._write(snapshot, info)
        except BaseException as exc:  # surfaced by wait()
            log.error("checkpoint write for step %s failed: %s", info["step"], exc)
            self._writer_error = exc

    def _write(self, state: dict[str, Any], info: dict[str, Any]) -> None:
        tmp = self.folders.begin(info["step"])
        try:
            started = time.perf_counter()
            state_path = tmp / STATE_FILE
            torch.save(state, state_path)
            fsync_path(state_path)
            size, digest = file_digest(state_path)
        except BaseException:
            self.folders.discard(tmp)
            raise
        files = {STATE_FILE: {"size": size, "sha256": digest}}
        info = {**info, "write_s": round(time.perf_counter() - started, 3)}
        final = self.folders.commit(tmp, info["step"], files=files, info=info)
        if self.keep_best and info["metric"] is not None:
            self.folders.update_best(final.name, info)
        self.folders.prune(info["step"])


# -- reading ----------------------------------------------------------------------------------------------------
class _Corrupt(Exception):
    """A checkpoint that is incomplete or damaged (as opposed to one that is unsafe to load)."""


def _load_checkpoint(
    path: Path, map_location: Any, *, check: Check | None = None, max_bytes: int | None = None
) -> dict[str, Any]:
    state_path = path / STATE_FILE if path.is_dir() else path
    meta = None
    if path.is_dir():
        meta = _read_meta(path, quick_check=False)
        if meta is None:
            raise _Corrupt(f"{path} has no valid {META_FILE} matching its {STATE_FILE}")
    elif not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist", hint="check the path, or remove it to start fresh")
    try:
        check_archive(state_path)
    except ArchiveError as exc:
        raise _Corrupt(str(exc)) from exc
    outline = _torch_load(state_path, "meta")  # every field and every tensor's size; no tensor memory
    if check is not None:
        check(outline, meta)
    if max_bytes is not None:
        claimed, largest = tensor_bytes(outline)
        if claimed > max_bytes:
            raise CheckpointError(
                f"its tensors would take {claimed / 2**20:.1f} MiB ({largest[0]} alone {largest[1] / 2**20:.1f} MiB), "
                f"more than this run's model and optimizer can hold ({max_bytes / 2**20:.1f} MiB); not loaded",
                hint="it is not this run's checkpoint (or was crafted); move it away",
            )
    if str(map_location) == "meta":
        return outline
    return _torch_load(state_path, map_location)


def _torch_load(state_path: Path, map_location: Any) -> dict[str, Any]:
    try:
        state = torch.load(state_path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        if "weights only" in str(exc).lower() or "unsupported global" in str(exc).lower():
            raise CheckpointError(
                f"refusing to load {state_path}: it contains objects other than tensors, lists, dicts and numbers",
                hint="hpctrain never unpickles arbitrary objects; re-save the checkpoint with plain state dicts",
            ) from exc
        raise _Corrupt(f"cannot unpickle {state_path}: {exc}") from exc
    except (RuntimeError, OSError, EOFError, ValueError, RecursionError, MemoryError) as exc:
        raise _Corrupt(f"cannot read {state_path}: {exc}") from exc
    if not isinstance(state, dict):
        raise _Corrupt(f"{state_path} does not hold a dict")
    return state


def _read_meta(path: Path, *, quick_check: bool) -> dict[str, Any] | None:
    """Meta of a complete checkpoint directory, or None. ``quick_check`` compares sizes but skips the hash."""
    meta = checkpoint_listing.checkpoint_meta(path, TRAINER_LAYOUT)
    if meta is None:
        return None
    if not quick_check and file_digest(path / STATE_FILE)[1] != meta["files"][STATE_FILE].get("sha256"):
        return None
    return meta


def _check_safe_types(value: Any, path: tuple[Any, ...] = ()) -> None:
    """Refuse at save time what ``weights_only`` loading would refuse at resume time."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_safe_types(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_safe_types(item, (*path, index))
    elif not isinstance(value, (torch.Tensor, *SAFE_SCALARS)):
        refuse_type(value, path)
