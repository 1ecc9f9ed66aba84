"""The server side of ``strategy: ps``: one shard of the parameters and its SGD state, driven by RPCs.

Each server task owns a shard of the model's parameters (:func:`shard_parameters`)
with an SGD optimizer and learning-rate schedule over exactly those
parameters. Workers call :func:`push` over ``torch.distributed.rpc`` once per
step with their gradients for the shard; the reply carries the shard's fresh
parameters (a push is also the pull). The server's main thread does no
training: it waits in :meth:`ShardServer.wait_round` for each step's round of
pushes, so it stays at the same step as the workers for stop agreement,
validation and checkpoints.

* sync: a push waits (an async RPC: no thread is held) until every worker has
  pushed; the server then applies the average of the gradients, summed in
  worker order, steps the schedule and answers everyone with the same values.
* async: a push is applied on arrival with its own gradient. A push computed on
  parameters more than ``max_staleness`` updates old is rejected: it is not
  applied, and the reply carries the current parameters (the worker pulls).
  The schedule steps once a round (every worker pushed once).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Literal

import torch
from torch.distributed import rpc

from hpctrain.errors import DistributedSetupError

Reply = tuple[int, list[torch.Tensor]]  # the shard's version (updates applied) and its parameters

_SERVER: ShardServer | None = None  # this process's shard, when it is a server


def shard_parameters(numels: Sequence[int], servers: int) -> list[int]:
    """The server owning each parameter: largest first onto the least-loaded server (ties: lowest index).

    Whole parameters, never slices, so every server's optimizer is a plain SGD over plain tensors.
    """
    if servers < 1:
        raise ValueError(f"servers must be at least 1 (got {servers})")
    load = [0] * servers
    owner = [0] * len(numels)
    for index in sorted(range(len(numels)), key=lambda i: (-numels[i], i)):
        server = min(range(servers), key=lambda s: (load[s], s))
        owner[index] = server
        load[server] += numels[index]
    return owner


class ShardServer:
    """One server's parameters, optimizer and schedule, and the bookkeeping of the current round."""

    def __init__(
        self,
        params: list[torch.Tensor],
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        workers: int,
        mode: Literal["sync", "async"],
        max_staleness: int | None,
    ) -> None:
        self.params, self.optimizer, self.scheduler = params, optimizer, scheduler
        self.workers, self.mode, self.max_staleness = workers, mode, max_staleness
        self.version = 0  # updates applied
        self.rounds = 0  # steps every worker has pushed for
        self.rejected = 0  # async pushes refused as too stale
        self._waited = 0  # rounds the main thread has consumed
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[list[torch.Tensor], torch.futures.Future]] = {}  # sync: this round's pushes
        self._pushed: set[int] = set()  # async: who pushed this round
        self._sums: deque[torch.Tensor] = deque()  # worker 0's batch sums, one per round

    def push(
        self, worker: int, worker_version: int, grads: list[torch.Tensor], sums: torch.Tensor | None
    ) -> torch.futures.Future:
        """Take one worker's gradients for this shard; the future's value is the :data:`Reply`."""
        future: torch.futures.Future = torch.futures.Future()
        answers: list[tuple[torch.futures.Future, Reply]] = []
        with self._cond:
            if sums is not None:
                self._sums.append(sums)
            if self.mode == "sync":
                self._pending[worker] = (grads, future)
                if len(self._pending) == self.workers:
                    self._apply([self._pending[w][0] for w in sorted(self._pending)])
                    reply = (self.version, [p.detach().clone() for p in self.params])
                    answers = [(f, reply) for _, f in self._pending.values()]
                    self._pending.clear()
                    self._end_round()
            else:
                if self.max_staleness is not None and self.version - worker_version > self.max_staleness:
                    self.rejected += 1
                else:
                    self._apply([grads])
                answers = [(future, (self.version, [p.detach().clone() for p in self.params]))]
                self._pushed.add(worker)
                if len(self._pushed) == self.workers:
                    self._pushed.clear()
                    self._end_round()
        for waiting, reply in answers:
            waiting.set_result(reply)
        return future

    def wait_round(self, timeout_s: float) -> torch.Tensor:
        """Block until the next round of pushes is applied; worker 0's batch sums of that round."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.rounds <= self._waited or not self._sums:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DistributedSetupError(
                        f"parameter server waited {timeout_s:g} s for the workers' gradients of step "
                        f"{self._waited + 1} of this attempt ({len(self._pending) + len(self._pushed)} of "
                        f"{self.workers} pushed)",
                        hint="see the workers' logs: one of them failed or is stuck; distributed.timeout_s "
                        "bounds this wait",
                    )
                self._cond.wait(left)
            self._waited += 1
            return self._sums.popleft()

    def _apply(self, pushes: list[list[torch.Tensor]]) -> None:
        """One SGD step with the mean of ``pushes`` (each one gradient per parameter), in push order."""
        with torch.no_grad():
            for index, param in enumerate(self.params):
                grad = pushes[0][index].to(param.dtype).clone()
                for other in pushes[1:]:
                    grad.add_(other[index])
                if len(pushes) > 1:
                    grad.div_(len(pushes))
                param.grad = grad
        self.optimizer.step()
        if self.mode == "sync":
            self.scheduler.step()
        for param in self.params:
            param.grad = None
        self.version += 1

    def _end_round(self) -> None:
        if self.mode == "async":
            self.scheduler.step()
        self.rounds += 1
        self._cond.notify_all()


def serve(server: ShardServer | None) -> None:
    """Make ``server`` the shard this process answers pushes for (None: this process is no server)."""
    global _SERVER
    _SERVER = server


@rpc.functions.async_execution
def push(
    worker: int, worker_version: int, grads: list[torch.Tensor], sums: torch.Tensor | None
) -> torch.futures.Future:
    """RPC target on a server: see :meth:`ShardServer.push`."""
    if _SERVER is None:
        raise RuntimeError("a gradient push reached a task that is not a parameter server")
    return _SERVER.push(worker, worker_version, grads, sums)
