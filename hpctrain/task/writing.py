"""How a task checkpoint reaches the disk: the async save's copy, DCP's write, rank 0's commit, the pruning.

A save (``checkpointer.py``) hands this module the state each rank writes and
the temp folder rank 0 began:

* :meth:`SaveWriter.write` writes it in the loop's thread (a sync save):
  ``dcp.save`` over the checkpointer's DCP group, each rank's file fsynced;
  rank 0 then commits the folder (``meta.json`` last, renamed into place:
  ``contract/step_folders.py``). A state on the CPU is written by
  :class:`FileWriter`: DCP's format (one ``torch.save`` archive per value),
  without DCP's per-value stream wrapper and loader;
* an async save first copies the state to memory (:class:`Staging`, below),
  then :meth:`SaveWriter.start` writes that copy in a background thread kept
  from save to save, commit included, and returns at once;
  :meth:`SaveWriter.wait` waits for it. It is ``dcp.save`` in that thread,
  not ``dcp.async_save``: the latter starts a thread per save that competes
  with the loop for the GIL while the loop is still blocked, and stages into
  fresh buffers of its own;
* the pruning of older folders (the newest ``keep_last`` are kept) follows a
  commit in that background thread, also after a sync save: removing a 200 MB
  folder took 0.05 s of the loop's time, for files nothing reads any more. It
  is finished before the next save or load looks at the folders, and a
  process's exit waits for it (a folder left behind is removed by the next
  prune anyway).

The copy (staging) is the only time an async save blocks the loop. Two things
make it cheap, as in the built-in trainer's ``trainer/snapshot.py``:

* **Kept buffers.** A fresh 200 MB is not a copy but an allocation whose every
  page faults in as it is written: on CPU it took the stall from the trainer's
  0.12-0.18 of a plain ``torch.save`` to 0.6 (``benchmarks/task_checkpoint.py``).
  :class:`Staging` keeps its buffers (pinned where CUDA is) and makes them anew
  only when the state's layout changed (an optimizer that created its state, a
  blob that grew): a copy into buffers of another layout would be wrong, not
  slow.
* **Parallel copies.** The host copies run as a few single-threaded streams on
  a kept pool (``task/host_copy.py``, the trainer's too).

The copy is of DCP's flat state (``model.layer.weight``,
``optimizer.param_groups.0.lr``): its tensors are the buffers, its plain values
(a learning rate a scheduler changed) the current ones. DTensor shards are
copied through their local tensors.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._state_dict_utils import _create_cpu_state_dict
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, _StorageInfo
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor

from hpctrain.contract.step_folders import StepFolders, file_digest
from hpctrain.task import dcp_io
from hpctrain.task.group import DCP_ERRORS, SideGroup
from hpctrain.task.host_copy import HostCopies

log = logging.getLogger(__name__)

WRITE_BUFFER_BYTES = 1 << 20  # torch.save writes each value's headers in many small pieces


class Staging:
    """Kept copies of a state's tensors (see the module doc); :meth:`stage` before each async write."""

    def __init__(self) -> None:
        self._buffers: dict[str, Any] = {}
        self._layout: tuple[Any, ...] = ()
        self._copies = HostCopies("checkpoint-staging")

    def stage(self, state: dict[str, Any], *, flat: bool = False) -> dict[str, Any]:
        """A copy of ``state`` whose tensors are kept buffers, DCP's flat keys grouped by part
        (``dcp_io.by_part``). The previous save's write must have finished (the checkpointer waits for it
        first): the buffers are overwritten. ``flat``: ``state`` has DCP's flat keys already."""
        flat_state = state if flat else flatten_state_dict(state)[0]
        layout = state_layout(flat_state)
        if layout != self._layout:
            tensors = {key: value for key, value in flat_state.items() if isinstance(value, torch.Tensor)}
            self._buffers = _create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())
            self._layout = layout
        staged: dict[str, Any] = {}
        host: list[tuple[torch.Tensor, torch.Tensor]] = []
        device = False
        for key, value in flat_state.items():
            if not isinstance(value, torch.Tensor):
                staged[key] = value
                continue
            buffer = self._buffers[key]
            staged[key] = buffer
            if buffer is value:  # DCP's helper keeps a 0-d DTensor as it is: copy it whole
                staged[key] = value.detach().clone()
                continue
            target, source = (
                (buffer._local_tensor, value._local_tensor) if isinstance(value, DTensor) else (buffer, value)
            )
            if source.device.type == "cpu":
                host.append((target, source.detach()))
            else:
                target.copy_(source.detach(), non_blocking=True)
                device = True
        self._copies.copy(host)
        if device:
            torch.cuda.synchronize()  # the device-to-host copies must land before the writer reads them
        return dcp_io.by_part(staged)

    def close(self) -> None:
        """Let go of the buffers and the copying threads (a later :meth:`stage` makes them again)."""
        self._buffers, self._layout = {}, ()
        self._copies.close()


def state_layout(flat: dict[str, Any]) -> tuple[Any, ...]:
    """What a staging buffer must match: each entry's key, and a tensor's type, shape, element type and device
    (a plain value's type only: it is not copied into a buffer)."""
    return tuple(
        (key, type(value), tuple(value.shape), value.dtype, value.device)
        if isinstance(value, torch.Tensor)
        else (key, type(value))
        for key, value in flat.items()
    )


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

    def start(
        self,
        staged: dict[str, Any],
        tmp: Path,
        step: int,
        facts: dict[str, Any],
        started: float,
        *,
        failed: BaseException | None = None,
    ) -> None:
        """Write and commit ``staged`` (a copy nothing else changes) in the background.

        ``failed``: this rank's copy failed. Its write still joins the others' ``dcp.save``, and fails in its
        planning step, which DCP gathers: every rank's write fails and rank 0 commits nothing; :meth:`wait`
        returns the error (an async save's agreement on how it went is the next ``wait``'s, not the stall's)."""
        self._writing = self._background().submit(
            self._write, staged, tmp, step, facts, started, prune_later=False, failed=failed
        )

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
        self,
        state: dict[str, Any],
        tmp: Path,
        step: int,
        facts: dict[str, Any],
        started: float,
        *,
        prune_later: bool,
        failed: BaseException | None = None,
    ) -> None:
        writer = FileWriter(tmp)
        planner = dcp_io.LookupPlanner() if failed is None else _Failed(failed)
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


class _Failed(dcp_io.LookupPlanner):
    """The planner of a rank whose copy failed: its planning step raises that error, which DCP hands every rank."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error = error

    def create_local_plan(self) -> SavePlan:
        raise self.error


class FileWriter(FileSystemWriter):
    """DCP's file-system writer (one file per rank, fsynced), writing each value of a state that is all on
    the CPU straight into the file: the same ``torch.save`` archive per value and the same record of where
    each lies as DCP's own loop, without its per-value stream wrapper (a class made per value) and loader
    (a ResNet-50 has 492 values). A state with values on a device goes through DCP's loop, which overlaps
    the copies to the host with the writes."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, sync_files=True)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> torch.futures.Future[list[WriteResult]]:
        state = getattr(planner, "state_dict", None)
        on_cpu = isinstance(state, dict) and all(
            not isinstance(value, torch.Tensor) or value.device.type == "cpu" for value in state.values()
        )
        if not on_cpu or self.thread_count != 1 or self.transforms.extensions:
            return super().write_data(plan, planner)
        name = f"{plan.storage_data.prefix}0{DEFAULT_SUFFIX}"
        results = []
        with open(Path(self.path) / name, "wb", buffering=WRITE_BUFFER_BYTES) as stream:
            byte_items = [item for item in plan.items if item.type == WriteItemType.BYTE_IO]
            for item in byte_items + [item for item in plan.items if item.type != WriteItemType.BYTE_IO]:
                offset = stream.tell()
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    stream.write(data.getbuffer())
                else:
                    tensor = data.detach()
                    if tensor.untyped_storage().size() != tensor.nbytes:  # a view: save only its elements
                        tensor = tensor.clone()
                    torch.save(tensor, stream)
                length = stream.tell() - offset
                results.append(WriteResult(item.index, length, _StorageInfo(name, offset, length)))
            stream.flush()
            os.fsync(stream.fileno())
        done: torch.futures.Future[list[WriteResult]] = torch.futures.Future()
        done.set_result(results)
        return done
