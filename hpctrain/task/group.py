"""The checkpointer's own gloo process group: bounded agreement between ranks, and where DCP talks.

Every collective a checkpoint makes goes through groups of its own, made once
when the checkpointer is built (every rank builds them, like any process group):

* its timeout bounds every wait: a save or load that some ranks never join
  fails within ``timeout_s`` -- :meth:`SideGroup.arrive` (every rank's word to rank 0, its answer back)
  names the ranks that did not come -- instead of hanging until the training
  group's timeout (or forever);
* making the groups is collective too, but it is not a point where the ranks
  are together (rank 0 may still be writing a dataset index when rank 1 builds
  its checkpointer): they are made with a wait of at least ``BUILD_WAIT_S``, and
  the configured timeout is set once every rank is in (with a short
  ``timeout_s`` the ranks' skew alone failed the build: CI #56);
* they are gloo, on the CPU, whatever the training group is (NCCL): DCP's
  planning collectives, and an async save's collectives in its background
  thread (on a second group, apart from the checkpointer's own), never mix
  with the training loop's collectives or with each other;
* it knows each rank's local rank (:meth:`SideGroup.writers`), which orders
  who writes what of the replicated state (``dcp_io.assign_replicated``).

Without a process group (one process) every method is a no-op.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from hpctrain.contract.step_folders import StepFolders
from hpctrain.errors import CheckpointError
from hpctrain.task.session import session

# What a DCP save or load raises: its gathered failure of every rank (a BaseException, not an Exception), or
# the error one rank raised alone.
DCP_ERRORS = (Exception, CheckpointException)

_SEE_RANK_0 = "see rank 0's log"
_LOWEST = -(2**62)  # what a rank other than 0 offers in arrive(): below any offer of rank 0's
_ARRIVE_TAG = 0x6870  # the tag of arrive()'s messages ("hp")
BUILD_WAIT_S = 300.0  # how long making the groups waits for every rank to make them


class _Missing(Exception):
    """A rank that did not come to :meth:`SideGroup.arrive` within the timeout (the message names it)."""


class SideGroup:
    """Two gloo groups over every rank of the default group, with a timeout (made on first use if not at once):
    one for the checkpointer's own agreement, one for DCP, whose async saves talk from a background thread
    while the checkpointer (or the next save) may talk too -- two threads on one group would mix their calls."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout = timedelta(seconds=timeout_s)
        self._group: Any = None
        self._dcp_group: Any = None
        self._writers: tuple[int, ...] | None = None
        self._made = False
        self._ensure()

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _ensure(self) -> Any:
        if not self._made and self.distributed:
            build = max(self.timeout, timedelta(seconds=BUILD_WAIT_S))
            try:
                self._group = dist.new_group(backend="gloo", timeout=build)
                self._dcp_group = dist.new_group(backend="gloo", timeout=build)
                local = torch.tensor([session().info.local_rank], dtype=torch.int64)
                gathered = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
                dist.all_gather(gathered, local, group=self._group)
            except RuntimeError as exc:
                raise CheckpointError(
                    f"Checkpointer on rank {dist.get_rank()}: not every rank built one within "
                    f"{build.total_seconds():g} s ({first_line(exc)})",
                    hint="every rank must build the Checkpointer (it is collective); an `if rank == 0:` "
                    "around it is the usual cause",
                ) from exc
            for group in (self._group, self._dcp_group):
                shorten(group, self.timeout)
            # every rank, by local rank: each node's first rank, then each node's second one, ...
            self._writers = tuple(sorted(range(len(gathered)), key=lambda rank: (int(gathered[rank]), rank)))
            self._made = True
        return self._group

    def writers(self) -> tuple[int, ...]:
        """Every rank, the first rank of each node first, then the second of each, ...: the order in which
        replicated entries are dealt out (``dcp_io.assign_replicated``), so that the nodes share them evenly
        and so do the ranks of a node."""
        self._ensure()
        return self._writers or ()

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Around a DCP call: without a process group, DCP's warning that it assumes one process is expected."""
        with warnings.catch_warnings():
            if self._ensure() is None:
                warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            yield

    def dcp_args(self) -> dict[str, Any]:
        """What to pass DCP's save/load so that it talks over this group."""
        return {"process_group": self._dcp_group} if self._ensure() is not None else {"no_dist": True}

    def arrive(self, what: str, step: int, *, alike: int = 0, offer: int = 0) -> tuple[bool, int]:
        """Every rank is at ``what`` (within the timeout), and at the same ``step``; else a clear error.

        In the same exchange: whether every rank passed the same ``alike`` (a signature), and rank 0's
        ``offer`` (what the others pass is ignored) -- a save agrees on all of it at once, in one exchange
        (:meth:`_gather_max`), not in a barrier and a reduction: every message round is a wait for the
        slowest rank while the loop is blocked.
        """
        group = self._ensure()
        if group is None:
            return True, offer
        rank = dist.get_rank()
        offered = offer if rank == 0 else _LOWEST
        mine = torch.tensor([step, -step, alike, -alike, offered], dtype=torch.int64)
        try:
            bounds = self._gather_max(group, mine)
        except _Missing as exc:
            raise CheckpointError(
                f"checkpoint {what} on rank {rank}: not every rank called it within "
                f"{self.timeout.total_seconds():g} s ({exc})",
                hint="every rank must call save()/load() at the same step; an `if rank == 0:` around "
                "save() is the usual cause (Checkpointer(timeout_s=...) sets the wait)",
            ) from exc
        high, low = int(bounds[0]), -int(bounds[1])
        if high != low:
            raise CheckpointError(
                f"checkpoint {what} on rank {rank}: the ranks called it at different steps ({low} to {high})",
                hint="call save() on every rank with the same step number",
            )
        return int(bounds[2]) == -int(bounds[3]), int(bounds[4])

    def _gather_max(self, group: Any, mine: torch.Tensor) -> torch.Tensor:
        """The element-wise largest of every rank's ``mine``, on every rank: each rank sends its own to rank 0,
        which waits for all of them within the timeout and answers with the largest -- gloo's monitored
        barrier's two message rounds, carrying the values, so that one exchange both names the ranks that did
        not come and agrees (it was a monitored barrier, then an all-reduce with rounds of its own).

        A wait that times out closes every pair of gloo's context, so rank 0 cannot tell the ranks that came
        that one did not: it raises, and they hear that it did not answer. The answer round has a timeout of
        its own (the ranks it goes to are already waiting: a peer that came at the last moment must not make
        it a raw gloo error on rank 0), and a rank waits for the answer for up to twice the timeout (rank 0 may
        have come up to one timeout after it, and then waits up to one for the others)."""
        timeout = self.timeout.total_seconds()
        deadline = time.monotonic() + timeout

        def left(until: float) -> timedelta:
            return timedelta(seconds=max(0.001, until - time.monotonic()))

        if dist.get_rank() != 0:
            answer = torch.empty_like(mine)
            try:
                dist.isend(mine, dst=0, group=group, tag=_ARRIVE_TAG).wait(left(deadline))
                dist.irecv(answer, src=0, group=group, tag=_ARRIVE_TAG).wait(left(deadline + timeout))
            except RuntimeError as exc:
                raise _Missing(f"rank 0 did not answer: {_SEE_RANK_0}") from exc
            return answer
        received = {peer: torch.empty_like(mine) for peer in range(1, dist.get_world_size())}
        pending = {peer: dist.irecv(value, src=peer, group=group, tag=_ARRIVE_TAG) for peer, value in received.items()}
        missing = []
        for peer, work in pending.items():
            try:
                work.wait(left(deadline))
            except RuntimeError:
                missing.append(peer)
        if missing:
            names = ", ".join(map(str, missing))
            raise _Missing(f"rank{'s' if len(missing) > 1 else ''} {names} did not")
        answer = torch.stack([mine, *received.values()]).amax(dim=0)
        answered = time.monotonic() + timeout
        try:
            for work in [dist.isend(answer, dst=peer, group=group, tag=_ARRIVE_TAG) for peer in received]:
                work.wait(left(answered))
        except RuntimeError as exc:
            raise _Missing(f"a rank that came did not take the answer ({exc})") from exc
        return answer

    def begin_temp(self, folders: StepFolders, step: int, is_main: bool) -> tuple[int, str]:
        """Rank 0 begins ``step``'s temp folder: (its token as a number, to offer in :meth:`arrive`; -1 and
        why when it cannot). The other ranks: (0, "")."""
        if not is_main:
            return 0, ""
        try:
            return int(folders.begin(step).name.rsplit("-", 1)[1], 16), ""
        except OSError as exc:
            return -1, f"{exc.strerror or exc}"

    def temp_path(self, folders: StepFolders, step: int, number: int, problem: str) -> Path:
        """The temp folder rank 0 began, from the number it offered (or the same error on every rank)."""
        if number < 0:
            raise CheckpointError(
                f"cannot make a checkpoint folder under {folders.directory}: {problem or _SEE_RANK_0}",
                hint="the checkpoint directory must be a writable folder on a filesystem every node shares",
            )
        return folders.temp_path(step, f"{number:08x}")

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank."""
        group = self._ensure()
        if group is None:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.broadcast(tensor, src=0, group=group)
        return int(tensor[0])

    def max_int(self, value: int) -> int:
        """The largest ``value`` over the ranks."""
        group = self._ensure()
        if group is None:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        return int(tensor[0])

    def barrier(self) -> None:
        group = self._ensure()
        if group is not None:
            dist.barrier(group=group)


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message; of DCP's gathered failure, the first failing rank's own exception."""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank, (cause, _) = min(exc.failures.items(), key=lambda item: item[0])
        return f"rank {rank}: {first_line(cause)}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def shorten(group: Any, timeout: timedelta) -> None:
    """Set ``group``'s timeout for what follows (made with a longer one): ``dist.set_timeout`` (newer torch),
    the private ``_set_pg_timeout`` before it; a torch with neither keeps the longer wait for the
    collectives after a save's barrier, whose own wait is ``timeout`` whatever the group's is."""
    setter = getattr(dist, "set_timeout", None) or getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is not None:
        setter(timeout, group)
