"""How a task checkpoint reaches the disk: DCP's write, rank 0's commit, and the pruning after it.

A save (``checkpointer.py``) hands this module the state each rank writes and
the temp folder rank 0 began:

* :meth:`SaveWriter.write` writes it in the loop's thread (a sync save):
  ``dcp.save`` over the checkpointer's DCP group, each rank's file fsynced;
  rank 0 then commits the folder (``meta.json`` last, renamed into place:
  ``contract/step_folders.py``);
* :meth:`SaveWriter.start` writes a staged copy (``staging.py``) in a
  background thread kept from save to save, commit included, and returns at
  once; :meth:`SaveWriter.wait` waits for it. It is ``dcp.save`` in that thread,
  not ``dcp.async_save``: the latter starts a thread per save that competes with
  the loop for the GIL while the stall is still being measured, and stages into
  buffers of its own;
* the pruning of older folders (the newest ``keep_last`` are kept) follows a
  commit in that background thread, also after a sync save: removing a 200 MB
  folder took 0.05 s of the loop's time, for files nothing reads any more. It
  is finished before the next save or load looks at the folders, and a
  process's exit waits for it (a folder left behind is removed by the next
  prune anyway).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

from hpctrain.contract.step_folders import StepFolders, file_digest
from hpctrain.task import dcp_io
from hpctrain.task.group import DCP_ERRORS, SideGroup

log = logging.getLogger(__name__)


class SaveWriter:
    """Writes and commits one checkpointer's saves (see the module doc). ``facts`` of a save: what rank 0
    records in the folder's ``meta.json`` besides its files (the format, the world size, the parts)."""

    def __init__(self, folders: StepFolders, group: SideGroup, *, is_main: bool) -> None:
        self.folders, self.group, self.is_main = folders, group, is_main
        self._thread: ThreadPoolExecutor | None = None
        self._writing: Future | None = None
        self._pruning: Future | None = None

    def write(
        self, state: dict[str, Any], tmp: Path, step: int, facts: dict[str, Any], started: float
    ) -> BaseException | None:
        """Write ``state`` into ``tmp`` and (rank 0) commit it as ``step``; the error this rank met, if any."""
        try:
            self._write(state, tmp, step, facts, started, prune_later=True)
        except DCP_ERRORS as exc:  # every rank learns of it from the caller's agreement, then raises
            return exc
        return None

    def start(self, staged: dict[str, Any], tmp: Path, step: int, facts: dict[str, Any], started: float) -> None:
        """Write and commit ``staged`` (a copy nothing else changes) in the background."""
        self._writing = self._background().submit(self._write, staged, tmp, step, facts, started, prune_later=False)

    def wait(self) -> tuple[bool, BaseException | None]:
        """Wait for the background write and pruning: (whether a write was pending, its error)."""
        writing, self._writing = self._writing, None
        error = None
        if writing is not None:
            error = writing.exception()
        self.pruned()
        return writing is not None, error

    def pruned(self) -> None:
        """Wait for the pruning after a sync save (its failure is logged: the next prune tries again)."""
        pruning, self._pruning = self._pruning, None
        if pruning is not None and pruning.exception() is not None:
            log.warning("removing older checkpoints failed: %s", pruning.exception())

    def close(self) -> None:
        self.wait()
        if self._thread is not None:
            self._thread.shutdown()
            self._thread = None

    def _background(self) -> ThreadPoolExecutor:
        if self._thread is None:  # one thread: writes, commits and prunes happen in order
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        return self._thread

    def _write(
        self, state: dict[str, Any], tmp: Path, step: int, facts: dict[str, Any], started: float, *, prune_later: bool
    ) -> None:
        writer = FileSystemWriter(tmp, sync_files=True)
        planner = dcp_io.NodeWriterPlanner(self.group.node_writers())
        with self.group.quiet():
            metadata = dcp.save(state, storage_writer=writer, planner=planner, **self.group.dcp_args())
        if not self.is_main:
            return
        self._commit(tmp, step, metadata, {**facts, "write_s": round(time.perf_counter() - started, 3)})
        if prune_later:
            self._pruning = self._background().submit(self.folders.prune, step)
        else:
            self.folders.prune(step)

    def _commit(self, tmp: Path, step: int, metadata: Any, facts: dict[str, Any]) -> None:
        """Rank 0: meta.json with every file's size (and the metadata's digest), renamed into place."""
        files: dict[str, dict[str, Any]] = {
            name: {"size": size} for name, size in dcp_io.data_file_sizes(metadata).items()
        }
        size, digest = file_digest(tmp / dcp_io.METADATA_FILE)
        files[dcp_io.METADATA_FILE] = {"size": size, "sha256": digest}
        self.folders.commit(tmp, step, files=files, info=facts)
