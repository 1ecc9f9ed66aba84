"""``dp``: nn.DataParallel over the node's visible GPUs, one task per node.

Across nodes the tasks do by hand what DDP does: every forward starts from
rank 0's buffers, and gradients are averaged over tasks before the optimizer
step, so multi-node dp trains the same model as ddp with the same global batch.

With ``trainer.dp_parallel_loss`` the outputs stay on their GPUs and the loss
is computed per GPU (:mod:`hpctrain.trainer.strategies.dp_loss`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.runtime import heartbeat
from hpctrain.trainer.strategies.base import Strategy
from hpctrain.trainer.strategies.collectives import average_gradients, broadcast_state, distributed
from hpctrain.trainer.strategies.dp_loss import DataParallelModel, parallel_loss, parallel_sums

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.runtime.context import TaskEnv

log = logging.getLogger(__name__)


def dp_device_ids(device: torch.device) -> list[int]:
    """The GPUs DataParallel spreads each batch over: this task's device first, then the node's others."""
    if device.type != "cuda":
        return []
    first = device.index or 0
    return [first] + [i for i in range(torch.cuda.device_count()) if i != first]


class DataParallel(Strategy):
    name = "dp"
    evaluates_wrapped = True  # its forward is local to the task, so ranks may validate different shard sizes

    def __init__(self, promised_gpus: int | None = None, *, parallel_loss: bool = False) -> None:
        self.promised_gpus = promised_gpus  # per task, from the spec; None for a spec no profile resolved
        self.parallel_loss = parallel_loss  # trainer.dp_parallel_loss

    @classmethod
    def from_spec(cls, spec: JobSpec) -> DataParallel:
        gpus = spec.resources.gpus_per_node
        promised = None if gpus is None else gpus // spec.tasks_per_node
        return cls(promised, parallel_loss=spec.trainer.dp_parallel_loss)

    def check(self, env: TaskEnv, device: torch.device) -> None:
        if env.local_world_size > 1:
            raise TrainingConfigError(
                f"trainer.strategy: dp uses all of a node's GPUs from one task, but {env.local_world_size} tasks "
                "run per node",
                hint="remove resources.tasks_per_node (dp runs one task per node), or use trainer.strategy: ddp",
            )
        seen = self.gpus_per_task(device)
        if self.promised_gpus is not None and max(1, self.promised_gpus) != max(1, seen):
            raise TrainingConfigError(
                f"resources.gpus_per_node: the spec gives each dp task {self.promised_gpus} GPUs, but this task "
                f"({device}) sees {seen}; the batch per task and the global batch would silently change",
                hint="make resources.gpus_per_node the number of GPUs Slurm gives each node "
                "(see CUDA_VISIBLE_DEVICES in the task log), or use trainer.strategy: ddp",
            )
        super().check(env, device)

    def gpus_per_task(self, device: torch.device) -> int:
        """The GPUs this task sees (all of its node's visible GPUs)."""
        return len(dp_device_ids(device))

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        broadcast_state(module)  # every task starts from rank 0's weights
        if device.type == "cuda":
            wrapper = DataParallelModel if self.parallel_loss else nn.DataParallel
            return wrapper(module, device_ids=dp_device_ids(device), output_device=device)
        if torch.cuda.is_available():
            log.warning("dp on a CPU device of a node with GPUs: training unwrapped on the CPU")
            return module
        log.warning("dp without GPUs: DataParallel has nothing to spread over and just calls the model")
        return nn.DataParallel(module)

    def loss(self, criterion: nn.Module, output: Any, targets: torch.Tensor) -> torch.Tensor:
        return parallel_loss(criterion, output, targets)  # one tensor (plain dp, one GPU): the plain call

    def sums(self, output: Any, targets: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        return parallel_sums(output, targets, loss)

    def before_forward(self, module: nn.Module) -> None:
        if distributed():
            with heartbeat.phase("allreduce"):
                broadcast_state(module, buffers_only=True)

    def after_backward(self, module: nn.Module) -> None:
        if distributed():
            with heartbeat.phase("allreduce"):
                average_gradients(module)
