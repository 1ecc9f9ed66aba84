"""The interface every strategy implements: refuse bad layouts, wrap the model, take part in the step.

A strategy is asked, in the trainer's setup order:

* ``check(env, device)``: refuse a task layout it cannot run, naming the setting to change;
* ``gpus_per_task(device)``: how many GPUs one task spreads its batch over
  (only dp spreads; this feeds :class:`~hpctrain.spec.batch.BatchLayout`);
* ``wrap(module, device)``: the model the forward runs;
* ``before_forward`` / ``after_backward`` / ``loss`` / ``sums``: its share of the one train step
  (:mod:`hpctrain.trainer.step`);
* ``epoch_workers(host)``: an :class:`EpochWorkers` that trains whole epochs in other processes
  (hogwild), or None when the trainer's own loop runs the steps;
* ``state_parts()``: its own checkpoint parts (hogwild: every worker's optimizer and position).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

from hpctrain.errors import DistributedSetupError, TrainingConfigError
from hpctrain.trainer.evaluation import batch_sums
from hpctrain.trainer.strategies.collectives import distributed

if TYPE_CHECKING:
    from hpctrain.runtime.context import TaskEnv
    from hpctrain.runtime.stop import StopReason, StopRequest
    from hpctrain.spec.batch import BatchLayout
    from hpctrain.spec.models import JobSpec
    from hpctrain.trainer.reporting import Reporter
    from hpctrain.trainer.state import EpochSums, Progress, Stateful


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

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        return module

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


def refuse_several_tasks(name: str, env: TaskEnv) -> None:
    if env.world_size > 1:
        raise TrainingConfigError(
            f"trainer.strategy: {name} runs in one task, but this job started {env.world_size} tasks",
            hint="use trainer.strategy: ddp for several tasks, or resources.nodes: 1 with one task per node",
        )
