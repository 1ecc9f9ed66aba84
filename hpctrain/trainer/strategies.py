"""How one model is spread over devices and tasks: ``single``, ``ddp``, ``dp`` (``hogwild`` lives in hogwild.py).

* ``single``: one task, one device, no process group.
* ``ddp``: DistributedDataParallel, one task per device (``device_ids=None`` on CPU).
* ``dp``: nn.DataParallel over the node's visible GPUs, one task per node. Across
  nodes, tasks average gradients and broadcast buffers themselves, exactly as
  DDP would, so multi-node dp trains the same model as ddp.

Checkpoints and evaluation always use the unwrapped module (:func:`unwrap`).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hpctrain.errors import DistributedSetupError, TrainingConfigError
from hpctrain.runtime.context import TaskEnv

log = logging.getLogger(__name__)


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def check_strategy(strategy: str, env: TaskEnv, device: torch.device) -> None:
    """Refuse combinations that cannot run as asked, naming the setting to change."""
    if strategy in ("single", "hogwild") and env.world_size > 1:
        raise TrainingConfigError(
            f"trainer.strategy: {strategy} runs in one task, but this job started {env.world_size} tasks",
            hint="use trainer.strategy: ddp for several tasks, or resources.nodes: 1 with one task per node",
        )
    if strategy == "hogwild" and device.type == "cuda":
        raise TrainingConfigError(
            "trainer.strategy: hogwild is CPU-only (lock-free updates of one shared-memory model)",
            hint="set resources.gpus_per_node: 0 for hogwild, or use trainer.strategy: ddp on GPUs",
        )
    if strategy == "dp" and env.local_world_size > 1:
        raise TrainingConfigError(
            f"trainer.strategy: dp uses all of a node's GPUs from one task, but {env.local_world_size} tasks "
            "run per node",
            hint="remove resources.tasks_per_node (dp runs one task per node), or use trainer.strategy: ddp",
        )
    if env.world_size > 1 and not distributed():
        raise DistributedSetupError(
            f"{env.world_size} tasks but no process group is up",
            hint="start the trainer through hpctrain's launcher, which forms the process group",
        )


def dp_device_ids(device: torch.device) -> list[int]:
    """The GPUs DataParallel spreads each batch over: this task's device first, then the node's others."""
    if device.type != "cuda":
        return []
    first = device.index or 0
    return [first] + [i for i in range(torch.cuda.device_count()) if i != first]


def wrap_model(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """Wrap an on-device model for ``strategy``; ``single`` and ``hogwild`` return it unchanged.

    With deterministic algorithms on (``trainer.deterministic``), DDP keeps its
    first gradient-bucket layout. It normally rebuilds its buckets after the
    first iteration, and an all-reduce sums each element in an order that
    depends on where it sits in its bucket (ring algorithms chunk the buffer).
    A resumed run's first step then uses the initial layout where the
    uninterrupted run used the rebuilt one, and with more than two ranks the
    weights differ in the last bits (measured: 4 gloo ranks, resnet18).
    ``find_unused_parameters=True`` is what disables the rebuild; it costs one
    autograd-graph walk per step, and DDP warns once that it found no unused
    parameters (expected).
    """
    if strategy == "ddp" and distributed():
        device_ids = [device.index] if device.type == "cuda" else None
        fixed_buckets = torch.are_deterministic_algorithms_enabled()
        return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=fixed_buckets)
    if strategy == "ddp":
        log.info("ddp with a single task: training without a DistributedDataParallel wrapper")
    if strategy == "dp":
        if distributed():
            broadcast_state(model)
        if device.type == "cuda":
            return nn.DataParallel(model, device_ids=dp_device_ids(device), output_device=device)
        if torch.cuda.is_available():
            log.warning("dp on a CPU device of a node with GPUs: training unwrapped on the CPU")
            return model
        log.warning("dp without GPUs: DataParallel has nothing to spread over and just calls the model")
        return nn.DataParallel(model)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    while isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def devices_per_task(strategy: str, device: torch.device) -> int:
    """How many devices one task's batch is split over (the loader's batch is batch_size times this)."""
    return max(1, len(dp_device_ids(device))) if strategy == "dp" else 1


@torch.no_grad()
def broadcast_state(module: nn.Module, *, buffers_only: bool = False) -> None:
    """Make every rank's buffers (and parameters) rank 0's. Collective when distributed."""
    if not distributed():
        return
    tensors = list(module.buffers()) if buffers_only else [*module.parameters(), *module.buffers()]
    for group in _by_dtype(tensors):
        flat = _flatten_dense_tensors(group)
        dist.broadcast(flat, src=0)
        for tensor, synced in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
            tensor.copy_(synced)


@torch.no_grad()
def average_gradients(module: nn.Module) -> None:
    """All-reduce the mean of every gradient over ranks (multi-node dp). Collective when distributed."""
    if not distributed():
        return
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    world = dist.get_world_size()
    for group in _by_dtype(grads):
        flat = _flatten_dense_tensors(group)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat.div_(world)
        for grad, reduced in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
            grad.copy_(reduced)


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    return list(groups.values())
