"""The interface every strategy implements: refuse bad layouts, wrap the model, take part in the step.

A strategy is asked, in the trainer's setup order:

* ``check(env, device)``: refuse a task layout it cannot run, naming the setting to change;
* ``gpus_per_task(device)``: how many GPUs one task spreads its batch over
  (only dp spreads; this feeds :class:`~hpctrain.jobspec.batch.BatchLayout`);
* ``wrap(module, device)``: the model the forward runs;
* ``data_shard(env)``: which shard of the data this task trains and validates on (pipeline: its pipeline's);
* ``before_forward`` / ``after_backward`` / ``loss`` / ``sums``: its share of the one train step
  (:mod:`hpctrain.trainer.step`);
* ``train_step(step)``: the callable that trains one batch (pipeline runs its own schedule instead);
* ``evaluate(...)``: validation over every rank's shard (pipeline passes activations stage to stage);
* ``epoch_workers(host)``: an :class:`EpochWorkers` that trains whole epochs in other processes
  (hogwild), or None when the trainer's own loop runs the steps;
* ``state_parts()``: its own checkpoint parts (hogwild: every worker's optimizer and position).

The parameter server (ps) also uses the hooks below; every other strategy keeps their defaults:
``train_shard`` (the train shard a task loads), ``loads_data`` (False: the task serves instead of
training, see ``serve_step``), ``attach`` (after the optimizer and schedule exist), ``after_step``,
``sync_model`` (before validation and checkpoints: every rank gets the current model) and ``close``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from hpctrain.errors import DistributedSetupError, TrainingConfigError
from hpctrain.trainer.evaluation import Accuracy, batch_sums, evaluate
from hpctrain.trainer.strategies.collectives import broadcast_state, distributed

if TYPE_CHECKING:
    from hpctrain.jobspec.batch import BatchLayout
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.runtime.context import TaskEnv
    from hpctrain.runtime.stop import StopReason, StopRequest
    from hpctrain.trainer.reporting import Reporter
    from hpctrain.trainer.state import EpochSums, Progress, Stateful
    from hpctrain.trainer.step import TrainStep


@dataclass
class EpochHost:
    """What a strategy that trains epochs in worker processes gets from the trainer, and nothing more."""

    spec: JobSpec
    module: nn.Module  # the model the workers share
    layout: BatchLayout
    train_samples: int  # size of the train set
    progress: Progress  # updated as the workers report
    epoch_sums: EpochSums  # the workers' train sums are added here
    reporter: Reporter
    stop: StopRequest
    before_fork: Callable[[], None]  # e.g. wait for a checkpoint writer thread
    summary: dict[str, Any] = field(default_factory=dict)  # extra summary.json fields


class EpochWorkers(Protocol):
    """Trains whole epochs outside the trainer's loop (hogwild's forked workers)."""

    steps_per_epoch: int

    def train_epoch(self, epoch: int) -> StopReason | None: ...


class Strategy:
    """Defaults for a strategy that trains in this process on one device, with no collectives of its own."""

    name: ClassVar[str]
    evaluates_wrapped: ClassVar[bool] = False  # validate through the wrapper (dp), not the plain module

    @classmethod
    def from_spec(cls, spec: JobSpec) -> Strategy:
        return cls()

    def check(self, env: TaskEnv, device: torch.device) -> None:
        if env.world_size > 1 and not distributed():
            raise DistributedSetupError(
                f"{env.world_size} tasks but no process group is up",
                hint="start the trainer through hpctrain's launcher, which forms the process group",
            )

    def gpus_per_task(self, device: torch.device) -> int:
        """GPUs one task spreads its batch over (only dp spreads)."""
        return 0

    def data_shard(self, env: TaskEnv) -> tuple[int, int]:
        """(index, count) of the data shard this task loads: one shard per task for most strategies."""
        return env.global_rank, env.world_size

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        return module

    def train_step(self, step: TrainStep) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """What trains one batch and returns its sums: the shared step, unless the strategy runs its own."""
        return step

    def evaluate(
        self, model: nn.Module, module: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], **kwargs: Any
    ) -> Accuracy:
        """Accuracy over every rank's validation shard; ``kwargs`` go to :func:`~hpctrain.trainer.evaluation.evaluate`.

        Every rank evaluates rank 0's buffers; dp's forward is local to the task, so it evaluates
        the wrapper, the others the plain module (DDP's forward is a collective, val shards differ).
        """
        if distributed():
            broadcast_state(module, buffers_only=True)
        return evaluate(model if self.evaluates_wrapped else module, batches, **kwargs)

    def before_forward(self, module: nn.Module) -> None:
        """Runs at the top of every train step, before the forward."""

    def after_backward(self, module: nn.Module) -> None:
        """Runs after the backward, before the optimizer step."""

    def loss(self, criterion: nn.Module, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """The train batch's mean loss from what the wrapped model returned (dp's parallel loss: one output per GPU)."""
        return criterion(output, targets)

    def sums(self, output: Any, targets: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """The train batch's [correct1, correct5, loss*n, n] on the device."""
        return batch_sums(output.float(), targets, loss.float())

    def epoch_workers(self, host: EpochHost) -> EpochWorkers | None:
        return None

    def state_parts(self) -> dict[str, Stateful]:
        return {}

    # -- hooks only the parameter server uses ----------------------------------------------------------------
    loads_data: bool = True  # False: this task trains no batches; the loop calls serve_step() instead

    def train_shard(self, env: TaskEnv) -> tuple[int, int] | None:
        """(shard, shards) of the train set this task loads; None: as :meth:`data_shard` says."""
        return None

    def attach(
        self,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        steps_per_epoch: int,
    ) -> None:
        """Called once the optimizer and its schedule exist (before any resume)."""

    def after_step(self, sums: torch.Tensor) -> None:
        """Runs after each train step of a task that loads data, with the batch's sums."""

    def serve_step(self) -> torch.Tensor:
        """A task that loads no data: wait for this step's update; the sums to log for it."""
        raise NotImplementedError(f"{self.name} trains on every task")

    def sync_model(self, module: nn.Module) -> None:
        """Before validation and checkpoints: make every rank's module the current model. Collective."""

    def close(self, *, failed: bool) -> None:
        """Release what the strategy started (after the run, or after a failure)."""


def refuse_several_tasks(name: str, env: TaskEnv) -> None:
    if env.world_size > 1:
        raise TrainingConfigError(
            f"trainer.strategy: {name} runs in one task, but this job started {env.world_size} tasks",
            hint="use trainer.strategy: ddp for several tasks, or resources.nodes: 1 with one task per node",
        )
