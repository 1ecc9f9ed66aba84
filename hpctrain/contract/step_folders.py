"""Writing a checkpoints directory's ``step-N`` folders: complete or absent, whoever fills them. Torch-free.

The one implementation of a checkpoint folder's life, shared by the built-in
trainer (``trainer/checkpoint.py``: one ``state.pt`` that rank 0 writes) and
``hpctrain.task``'s checkpointer (a torch.distributed.checkpoint folder that
every rank writes a part of). The listing that readers use -- complete or
ignored -- is :func:`hpctrain.contract.checkpoint_listing.complete_checkpoints`.

1. :meth:`StepFolders.begin`: a fresh ``.tmp-step-N-<id>/`` beside the final
   folder (the first call of a writer first sweeps ``.tmp-*`` and ``.old-*``
   folders that crashed writers left);
2. the caller fills it and fsyncs what it wrote;
3. :meth:`StepFolders.commit`: ``meta.json`` -- format version, layout, every
   file with its size, the caller's facts -- written last and fsynced, the
   folder fsynced and renamed to ``step-N`` (a ``step-N`` of the same step is
   moved to ``.old-*`` first), the directory fsynced;
4. :meth:`StepFolders.prune`: the newest ``keep_last`` of this layout up to the
   step just saved (and the best, where kept, and any of a later step) stay;
   the others are renamed ``.old-*`` and removed. On
   FUSE and NFS a file still open somewhere keeps its folder for a while, so
   every prune retries the ``.old-*`` folders earlier ones could not remove.

One process commits into a directory (global rank 0); other ranks may fill a
temp folder it began. A reader never sees a half-written ``step-N``: either
the rename has happened, with meta.json inside, or the folder is not there.

What a directory holds is untrusted (anyone with write access to the run may
have planted folders), so the rules are:

* **One place for save, list, load and prune.** A directory that leads out
  of the folder it lies in (``RUN/checkpoints -> /scratch/...``) is refused
  by every one of them with the reason (:meth:`StepFolders.check_directory`):
  the listing never follows a link out of the run, so its checkpoints would
  be written but never found, and a requeued run would start over in
  silence. Name the real folder instead (it is then used where it is).
* **A folder's step is its meta.json's**, which its name must match
  (``checkpoint_listing.checkpoint_meta``: ASCII digits, at most 18 of them).
* **A load examines at most** :data:`MAX_EXAMINED` **step folders**, newest
  first, one at a time (:meth:`StepFolders.newest_first`): a directory
  crowded with damaged or planted folders ends in a refusal naming the
  count, in bounded time, never in a search of every one. A prune examines
  at most ``keep_last`` + :data:`MAX_EXAMINED`, up to the step just saved:
  folders of later steps are never examined, counted or removed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hpctrain.contract import checkpoint_listing, rundir
from hpctrain.contract.file_writes import fsync_path, user_file_mode, write_atomic
from hpctrain.contract.rundir import BEST_FILE, META_FILE, read_json_object, step_dir_name
from hpctrain.errors import CheckpointError

log = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
_HASH_CHUNK = 1 << 20
MAX_EXAMINED = 16  # step folders one load looks at, newest first (a directory keeps keep_last of them)


class StepFolders:
    """The write side of one checkpoints directory, for one layout (``checkpoint_listing.CHECKPOINT_LAYOUTS``)."""

    def __init__(self, directory: Path, *, layout: str, keep_last: int, keep_best: bool = False) -> None:
        if keep_last < 1:
            raise CheckpointError(f"keep_last must be at least 1 (got {keep_last})", hint="keep at least one")
        if layout not in checkpoint_listing.CHECKPOINT_LAYOUTS:
            raise ValueError(f"unknown checkpoint layout {layout!r}")
        self.directory = Path(directory)
        self.layout = layout
        self.keep_last = keep_last
        self.keep_best = keep_best
        self._swept = False

    # -- reading ------------------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete folders of this layout, oldest first."""
        self.check_directory()
        return checkpoint_listing.complete_checkpoints(self.directory, self.layout)

    def newest_first(self, *, newest: int | None = None) -> Iterator[Path]:
        """Complete folders of this layout (of step ``newest`` or older), newest first, for a load to try in
        turn; examined one at a time as they are asked for. Raises :class:`CheckpointError` once
        :data:`MAX_EXAMINED` step folders were examined and more are asked for."""
        self.check_directory()
        named = [
            child
            for child in checkpoint_listing.step_folders(self.directory)
            if newest is None or _step(child) <= newest
        ]
        for count, child in enumerate(named):
            if count == MAX_EXAMINED:
                raise CheckpointError(
                    f"the newest {MAX_EXAMINED} step folders under {self.directory} are incomplete, damaged or "
                    f"of another kind; the {len(named) - count} older ones were not examined (a load looks at "
                    f"{MAX_EXAMINED} at most)",
                    hint="move the damaged step folders away (each load names why it skipped them), then resume",
                )
            if child.is_dir() and checkpoint_listing.checkpoint_meta(child, self.layout) is not None:
                yield child

    def check_directory(self) -> None:
        """Raise :class:`CheckpointError` when the directory leads out of the folder it lies in (a symlink to
        scratch space): the listing would never follow it, so what is saved there would never be loaded."""
        if rundir.is_inside(self.directory, self.directory.parent):
            return
        target = os.path.realpath(self.directory)
        raise CheckpointError(
            f"{self.directory} is a link to {target}, outside {self.directory.parent}: hpctrain never follows a "
            "run's files out of the run, so checkpoints saved there would never be listed, loaded or pruned, and "
            "a requeued run would start over",
            hint=f"replace the link with a folder, or keep the whole run on that file system (output_dir); a "
            f"task.Checkpointer may name the folder itself: Checkpointer(directory={target!r})",
        )

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def best(self) -> Path | None:
        return checkpoint_listing.best_checkpoint(self.directory) if self.keep_best else None

    # -- one folder's life --------------------------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """A new, empty temp folder for step ``step`` (the directory is created; leftovers swept once)."""
        self.check_directory()
        self.directory.mkdir(parents=True, exist_ok=True)
        if not self._swept:
            self.sweep_leftovers()
        tmp = self.temp_path(step, uuid.uuid4().hex[:8])
        tmp.mkdir()
        return tmp

    def temp_path(self, step: int, token: str) -> Path:
        """The temp folder of ``step`` named by ``token`` (other ranks rebuild the path rank 0 began)."""
        return self.directory / f"{TEMP_PREFIX}{step_dir_name(step)}-{token}"

    def commit(self, tmp: Path, step: int, *, files: dict[str, dict[str, Any]], info: dict[str, Any]) -> Path:
        """Write meta.json into ``tmp`` last, then rename it into place as ``step-N``; returns that path.

        ``files``: every file the folder holds -> at least its ``size``. ``info``: the caller's facts
        (``global_step``, ``write_s``, ...). On failure the temp folder is removed and the error raised.
        """
        meta = {
            "format_version": checkpoint_listing.CHECKPOINT_FORMAT_VERSION,
            "layout": self.layout,
            "step": int(step),
            "global_step": int(step),
            **info,
            "files": files,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        final = self.directory / step_dir_name(step)
        try:
            write_file_synced(tmp / META_FILE, json.dumps(meta, indent=2) + "\n")
            fsync_path(tmp)
            self.install(tmp, final)
        except BaseException:
            self.discard(tmp)
            raise
        return final

    def install(self, tmp: Path, final: Path) -> None:
        """Rename ``tmp`` to ``final``; an existing ``final`` (the same step saved again) is replaced."""
        old = None
        if final.exists():
            old = self.directory / f"{OLD_PREFIX}{final.name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_path(self.directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def discard(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    # -- retiring ------------------------------------------------------------------------------------------------
    def update_best(self, name: str, info: dict[str, Any]) -> None:
        """Point ``best.json`` at folder ``name`` if its ``metric`` is the best so far (higher is better)."""
        current = read_json_object(self.directory / BEST_FILE)
        previous = current.get("metric") if current else None
        still_there = current is not None and (self.directory / str(current.get("dir"))).is_dir()
        if still_there and isinstance(previous, (int, float)) and previous >= info["metric"] and current["dir"] != name:
            return
        pointer = {"dir": name, "step": info["step"], "epoch": info.get("epoch"), "metric": info["metric"]}
        rundir.write_json_atomic(self.directory / BEST_FILE, pointer)

    def prune(self, saved: int | None = None) -> None:
        """Keep the newest ``keep_last`` complete folders of this layout (and the best); remove the others.

        ``saved``: the step just saved. Folders of later steps are neither examined nor counted among the
        newest (nor removed): a folder planted as ``step-99999999``, or a damaged one a resume skipped, must
        not push the writer's own checkpoints out. At most ``keep_last`` + :data:`MAX_EXAMINED` folders are
        examined, newest first: a crowded directory is thinned over several saves."""
        self.check_directory()
        ours = [
            path for path in checkpoint_listing.step_folders(self.directory) if saved is None or _step(path) <= saved
        ]
        found = [  # newest first; a crowded directory is thinned over several saves, never all at once
            path
            for path in ours[: self.keep_last + MAX_EXAMINED]
            if path.is_dir() and checkpoint_listing.checkpoint_meta(path, self.layout) is not None
        ]
        keep = set(found[: self.keep_last])
        best = self.best()
        if best is not None:
            keep.add(best)
        for path in found:
            if path not in keep:
                trash = self.directory / f"{OLD_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
                os.rename(path, trash)
                shutil.rmtree(trash, ignore_errors=True)
        # A removal can fail for a while: on FUSE and NFS a file still open somewhere (a data-loader
        # worker forked while a writer held a checkpoint file open keeps the descriptor until it exits) is
        # renamed .fuse_hidden* / .nfsXXXX and its folder stays. Each prune retries the older ones.
        for child in self.directory.iterdir():
            if child.is_dir() and child.name.startswith(OLD_PREFIX):
                shutil.rmtree(child, ignore_errors=True)

    def sweep_leftovers(self) -> None:
        """Remove half-written folders of crashed writers (only this directory's one writer calls it)."""
        if self.directory.is_dir():
            for child in self.directory.iterdir():
                if child.is_dir() and child.name.startswith((TEMP_PREFIX, OLD_PREFIX)):
                    log.info("removing leftover %s from an interrupted checkpoint write", child)
                    shutil.rmtree(child, ignore_errors=True)
        self._swept = True


def _step(folder: Path) -> int:
    return checkpoint_listing.folder_step(folder.name) or 0


# -- durable file operations ------------------------------------------------------------------------------------
def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def write_file_synced(path: Path, text: str) -> None:
    write_atomic(path, text, mode=user_file_mode())  # readable as the checkpoint's other files are
