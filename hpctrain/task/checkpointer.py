"""Exact resume for a user's loop: register what the loop is made of, save at your cadence and on a stop, load on start.

::

    ckpt = task.Checkpointer(model=model, optimizer=optimizer, scheduler=scheduler, data=loader, every_steps=500)
    start = ckpt.load()                       # the newest complete checkpoint's step, 0 for a fresh run
    for step in range(start, total_steps):
        if task.should_stop():
            ckpt.save(step)                   # blocks until it is on disk
            return task.stopped()
        ...
        ckpt.maybe_save(step + 1)             # every 500 steps

Every rank calls every method at the same point (they are collective). A save
is a torch.distributed.checkpoint folder (``dcp_io.py``: sharded state by the
rank that holds it, replicated state once per node) written into a temp folder
and renamed into place by rank 0 after ``meta.json`` -- the folder life the
built-in trainer's checkpoints share (``contract/step_folders.py``): a
``step-N`` is complete or ignored, the newest ``keep_last`` are kept. With
``async_save`` a save blocks only while it copies the state to memory.

A save or load that not every rank joins fails within ``timeout_s`` with an
error naming the ranks, instead of hanging; ranks that save different steps
fail at once. A load takes the newest complete folder, skips a damaged or
unsafe one (a warning; the previous one is used; when none is usable it fails
naming each, and keeps them), reshards onto the current ranks, and refuses a
folder written by another model or run -- naming the keys that do not match,
before anything is loaded. What a folder holds is untrusted input
(``checkpoint_check.py``, ``dcp_io.py``): no pickle but DCP's own metadata
classes, nothing read outside its files, nothing allocated it does not hold,
and nothing read beyond what the registered parts can legitimately need
(``dcp_io.metadata_budget``); a load examines at most
``step_folders.MAX_EXAMINED`` folders, and a directory that is a link out of
the run is refused by every call (``contract/step_folders.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain.contract import checkpoint_listing, rundir
from hpctrain.contract.checkpoint_listing import DCP_LAYOUT
from hpctrain.contract.rundir import step_dir_name
from hpctrain.contract.runfiles import real_path
from hpctrain.contract.step_folders import StepFolders
from hpctrain.errors import CheckpointError
from hpctrain.runtime import heartbeat
from hpctrain.task import dcp_io
from hpctrain.task.checkpoint_check import DamagedCheckpoint, check_fits, metadata_of
from hpctrain.task.dcp_io import UnsafeCheckpoint
from hpctrain.task.dcp_read import SafeReader, load_into
from hpctrain.task.group import DCP_ERRORS, SideGroup, first_line
from hpctrain.task.parts import (
    Part,
    apply_loaded,
    classify,
    decode_blobs,
    guess_fits,
    held_keys,
    live_state,
    load_template,
    save_state,
)
from hpctrain.task.plain_state import snapshot
from hpctrain.task.process_group import require_group
from hpctrain.task.session import session
from hpctrain.task.writing import SaveWriter, Staging

log = logging.getLogger(__name__)

FORMAT = "hpctrain-task"
REFUSED = -2  # what rank 0 broadcasts instead of a step when it refuses the directory
DEFAULT_TIMEOUT_S = 600.0


class Checkpointer:
    """Saves and loads registered parts as complete-or-ignored ``step-N`` folders (see the module doc).

    ``directory`` defaults to the run's checkpoint directory (``task.context().checkpoint_dir``); one you
    name is used where it really is (symlinks resolved).
    Construct it on every rank, after the process group is up.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        keep_last: int = 2,
        every_steps: int | None = None,
        async_save: bool = False,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **parts: Any,
    ) -> None:
        require_group("hpctrain.task.Checkpointer")
        info = session().info
        self.info = info
        # a folder you name is taken where it really is (a link to scratch space works); the run's own
        # checkpoints must lie inside the run, as the trainer's (checkpoint_listing.checkpoint_meta)
        self.directory = real_path(directory) if directory is not None else info.checkpoint_dir
        self.folders = StepFolders(self.directory, layout=DCP_LAYOUT, keep_last=keep_last)
        if every_steps is not None and every_steps < 1:
            raise CheckpointError(f"Checkpointer: every_steps must be at least 1 (got {every_steps})")
        self.every_steps = every_steps
        self.async_save = async_save
        self.timeout_s = float(timeout_s)
        self.parts: list[Part] = []
        self.last_loaded: Path | None = None
        self.last_stall_s = 0.0
        self._skipped: list[str] = []  # the folders the last load passed over, and why
        self.step: int | None = None  # the step of the newest checkpoint saved or loaded
        self._group = SideGroup(self.timeout_s)
        self._writer = SaveWriter(self.folders, self._group, is_main=info.is_main)
        self._staging = Staging()  # kept: its buffers are reused from save to save (writing.py)
        self._pending_tmp: Path | None = None
        self._owners: tuple[int, dict[str, int]] | None = None  # (signature, owner of each replicated entry)
        # modules first: an optimizer is matched to the registered module whose parameters it updates
        ordered = sorted(parts.items(), key=lambda item: not isinstance(item[1], nn.Module))
        for name, obj in ordered:
            self.register(name, obj)

    # -- registering ----------------------------------------------------------------------------------------------
    def register(self, name: str, obj: Any, *, per_rank: bool = False) -> None:
        """Add a part; ``per_rank``: each rank's own state (restored to the same rank when the ranks are unchanged)."""
        if any(part.name == name for part in self.parts):
            raise CheckpointError(f"Checkpointer: a part named {name!r} is registered already")
        modules = [part for part in self.parts if part.kind == "module"]
        self.parts.append(classify(name, obj, modules, per_rank=per_rank))

    # -- saving -----------------------------------------------------------------------------------------------------
    def maybe_save(self, step: int) -> bool:
        """Save at every ``every_steps``-th step (and not the same step twice); whether it saved."""
        if self.every_steps is None or step % self.every_steps or step == self.step:
            return False
        self.save(step)
        return True

    def save(self, step: int, *, blocking: bool | None = None) -> Path:
        """Save every part as ``step-<step>``; returns its path. Collective.

        Blocks until the folder is in place, except with ``async_save`` (then only while the state is copied
        to memory; :meth:`wait` waits for the rest). A save after the ranks agreed to stop always blocks.
        """
        started = time.perf_counter()
        self.wait()
        current = session()
        blocking = (not self.async_save or current.agreed is not None) if blocking is None else blocking
        with heartbeat.phase("checkpoint"):
            state = save_state(self.parts, self.info.rank, self.info.device)
            flat, replicated, alike = self._replicated(state)
            number, problem = self._group.begin_temp(self.folders, step, self.info.is_main)
            try:  # one collective: every rank here, at this step, alike in what is replicated, and the folder
                same, number = self._group.arrive(f"save(step={step})", step, alike=alike, offer=number)
            except CheckpointError:
                if self.info.is_main and number >= 0:
                    self.folders.discard(self.folders.temp_path(step, f"{number:08x}"))
                raise
            tmp = self._group.temp_path(self.folders, step, number, problem)
            share = self._own_share(state, flat, replicated, alike if same else None)
            shared = share is not state  # DCP's flat keys: grouped by part before DCP sees them (dcp_io.by_part)
            facts = {
                "format": FORMAT,
                "world_size": self.info.world_size,
                "parts": {part.name: part.kind for part in self.parts},
            }
            if blocking:
                error = self._writer.write(dcp_io.by_part(share) if shared else share, tmp, step, facts, started)
                self._settle(step, tmp, error)  # every rank returns once rank 0 put the folder in place
            else:
                staged: dict[str, Any] = {}
                error: BaseException | None = None
                try:
                    staged = self._staging.stage(share, flat=shared)
                except DCP_ERRORS as exc:  # its write fails every rank's (writing.py); wait() raises it on all
                    error = exc
                self._pending_tmp = tmp
                self._writer.start(staged, tmp, step, facts, started, failed=error)  # last: it wants the GIL
        self.step = step
        self.last_stall_s = time.perf_counter() - started
        if current.summary is not None:
            current.summary.progress(step, force=True)
        return self.directory / step_dir_name(step)

    def wait(self) -> None:
        """Block until an async save is on disk (and in place); raise its error. Collective with async saves."""
        pending, error = self._writer.wait()
        if pending:
            self._settle(self.step, self._pending_tmp, error)

    def _settle(self, step: int | None, tmp: Path | None, error: BaseException | None) -> None:
        """Every rank agrees whether the save worked; on failure rank 0 removes its temp folder and all raise."""
        if not self._group.max_int(int(error is not None)):
            return
        if self.info.is_main and tmp is not None:
            self.folders.discard(tmp)
        cause = error or CheckpointError("it failed on another rank (see that rank's log)")
        raise self._failed("save", step, cause) from cause

    def close(self) -> None:
        """Wait for an async save, let go of its staging buffers and threads; the checkpointer can still be used."""
        self.wait()
        self._staging.close()
        self._writer.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()

    # -- loading ------------------------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """This directory's complete task checkpoints, oldest first."""
        self._writer.pruned()
        return self.folders.checkpoints()

    def latest(self) -> Path | None:
        self._writer.pruned()
        return self.folders.latest()

    def load(self, path: str | Path | None = None) -> int:
        """Restore every part from the newest complete checkpoint (or exactly ``path``); its step, 0 if none.

        A damaged folder is skipped with a warning (not one named by ``path``: that raises). Collective.
        """
        self.wait()
        self._skipped = []
        with heartbeat.phase("checkpoint"):
            self._group.arrive("load()", -1)
            refused: CheckpointError | None = None
            candidates = self._candidates(path)
            while True:
                try:
                    offer = next(candidates, -1)
                except CheckpointError as exc:  # rank 0 alone looked: the others learn of it below
                    offer, refused = REFUSED, exc
                step = self._group.broadcast_int(offer)
                if step == REFUSED:
                    raise refused or CheckpointError(f"{self.directory}: rank 0 refused to load (see its log)")
                if step < 0 and self._skipped:
                    raise CheckpointError(
                        f"no usable checkpoint under {self.directory}, so the loop cannot resume: "
                        + "; ".join(self._skipped),
                        hint="each was kept; move the damaged ones away and start again, or give a new run "
                        "its own folder",
                    )
                if step < 0:
                    return 0
                folder = Path(path) if path is not None else self.directory / step_dir_name(step)
                if self._load_folder(folder, explicit=path is not None):
                    break
        self.last_loaded, self.step = folder, step
        current = session()
        if current.summary is not None:
            current.summary.resumed(step)
        heartbeat.recorder().position(step)
        log.info("resumed from %s (step %d)", folder, step)
        return step

    def _candidates(self, path: str | Path | None) -> Iterator[int]:
        """Rank 0's steps to try, newest first, each folder examined when it is asked for (at most
        ``step_folders.MAX_EXAMINED`` of them); the others get them one by one."""
        if not self.info.is_main:
            return
        if path is not None:
            meta = rundir.read_json_object(Path(path) / rundir.META_FILE) or {}
            step = meta.get("global_step")
            if type(step) is not int or not 0 <= step <= checkpoint_listing.MAX_STEP:
                raise CheckpointError(f"{path} is not a complete hpctrain.task checkpoint (no meta.json with its step)")
            yield step
            return
        found = False
        for folder in self.folders.newest_first():
            found = True
            yield checkpoint_listing.folder_step(folder.name) or 0  # listed: the name says its meta.json's step
        if not found:
            foreign = checkpoint_listing.complete_checkpoints(self.directory)
            if foreign:
                raise CheckpointError(
                    f"{self.directory} holds {len(foreign)} checkpoints of another kind (the built-in trainer's "
                    f"state.pt, newest {foreign[-1].name}), none of hpctrain.task's: they would be ignored, and "
                    "saving would replace them",
                    hint="give this loop its own folder: Checkpointer(directory=...), or move those away",
                )

    def _load_folder(self, folder: Path, *, explicit: bool) -> bool:
        """Load ``folder`` on every rank: True when loaded, False when it is damaged (every rank agrees)."""
        damaged: str | None = None
        refused: CheckpointError | None = None
        try:
            # DCP's state helpers cost per parameter (a ResNet-50: 75 ms on a core): each part's own dictionary
            # is used when it has exactly the keys the checkpoint holds for it, which a save wrote with DCP's names
            live = live_state(self.parts, guessed=True)
            meta, metadata, budget = metadata_of(folder, FORMAT, held_keys(self.parts, self.info.rank, live))
            if not guess_fits(self.parts, live, metadata.state_dict_metadata):
                live = live_state(self.parts)
                meta, metadata, budget = metadata_of(folder, FORMAT, held_keys(self.parts, self.info.rank, live))
            same_ranks = meta.get("world_size") == self.info.world_size
            template = load_template(self.parts, self.info.rank, _blob_sizes(metadata), same_ranks, live)
            check_fits(folder, self.parts, template, metadata, self.info.rank, same_ranks)
        except DamagedCheckpoint as exc:
            damaged = str(exc)
        except CheckpointError as exc:
            refused = exc
        verdict = self._group.max_int(2 if refused else 1 if damaged else 0)
        if verdict == 2:
            raise refused or CheckpointError(f"{folder} cannot be loaded: another rank refused it (see its log)")
        if verdict == 1:
            return self._damaged(folder, damaged or "damaged, as another rank found", explicit)
        # Each rank reads what it holds without DCP's plan exchange (no_dist): the metadata says where every
        # value lies, and a rank's plan depends on nothing the others hold; the ranks agree on the outcome below.
        failed: str | None = None
        asked = snapshot(live)
        try:
            reader = SafeReader(folder, pickle_budget=budget, metadata=metadata)
            with self._group.quiet():
                load_into(template, reader)
        except UnsafeCheckpoint as exc:  # SafeReader's refusal of a value, before it is read
            failed = f"reading it failed: {exc.message}"
        except CheckpointError:
            raise
        except DCP_ERRORS as exc:  # an unsafe value DCP's reader met (SafeReader's refusal), a short file
            failed = f"reading it failed: {first_line(exc)}"
        if self._group.max_int(int(failed is not None)):
            return self._damaged(folder, failed or "reading it failed on another rank (see its log)", explicit)
        decoded, unsafe = {}, None
        try:  # every blob judged before any part is touched
            decoded = decode_blobs(self.parts, template, self.info.rank, self.info.device, same_ranks=same_ranks)
        except CheckpointError as exc:
            unsafe = exc.message
        if self._group.max_int(int(unsafe is not None)):
            return self._damaged(folder, unsafe or "a blob another rank read is unsafe or damaged", explicit)
        kept = apply_loaded(self.parts, template, decoded, self.info.rank, self.info.device, asked)
        if kept:
            log.warning(
                "%s was written by %s ranks, this run has %d: %s kept as this run made them (per-rank state)",
                folder,
                meta.get("world_size"),
                self.info.world_size,
                ", ".join(kept),
            )
        return True

    def _damaged(self, folder: Path, problem: str, explicit: bool) -> bool:
        if explicit:
            raise CheckpointError(f"{folder} cannot be loaded: {problem}", hint="load another one, or none")
        if self.info.is_main:
            log.warning("skipping damaged checkpoint %s (%s); trying the previous one", folder, problem)
        self._skipped.append(f"{folder.name}: {problem}")
        return False

    # -- helpers ----------------------------------------------------------------------------------------------------
    def _replicated(self, state: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, int], int]:
        """(DCP's flat state, its replicated entries' sizes, their signature), when there are several ranks."""
        if not self._group.writers():
            return None, {}, 0  # one process: it writes everything
        flat = dcp_io.flat_keys(state)
        replicated = dcp_io.replicated_sizes(flat)
        return flat, replicated, dcp_io.signature(replicated)

    def _own_share(
        self, state: dict[str, Any], flat: dict[str, Any] | None, replicated: dict[str, int], alike: int | None
    ) -> dict[str, Any]:
        """What this rank hands DCP: its shards, its own state, and the replicated entries assigned to it
        (``alike``: their signature, None when the ranks' replicated entries differ: DCP's planner dedups them)."""
        if flat is None or alike is None:
            return state
        if self._owners is None or self._owners[0] != alike:  # the same entries: the same assignment
            self._owners = (alike, dcp_io.assign_replicated(replicated, self._group.writers()))
        owner, rank = self._owners[1], self.info.rank
        return {key: value for key, value in flat.items() if owner.get(key, rank) == rank}

    def _failed(self, what: str, step: int | None, exc: BaseException) -> CheckpointError:
        return CheckpointError(
            f"{what} of checkpoint step {step} under {self.directory} failed on rank {self.info.rank}: "
            f"{first_line(exc)}",  # DCP's gathered failure prints every rank's traceback: its first rank's line
            hint="check free space and permissions of the checkpoint directory; the previous checkpoint is intact",
        )


def _blob_sizes(metadata: Any) -> dict[str, int]:
    """Saved size of every one-dimensional uint8 entry (the blobs)."""
    sizes = {}
    for key, entry in metadata.state_dict_metadata.items():
        size = getattr(entry, "size", None)
        dtype = getattr(getattr(entry, "properties", None), "dtype", None)
        if size is not None and dtype == torch.uint8 and len(size) == 1:
            sizes[key] = int(size[0])
    return sizes
