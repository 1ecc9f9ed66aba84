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

    With deterministic algorithms on (``trainer.deterministic``), DDP sums
    gradients in rank order (:func:`rank_ordered_allreduce`).
    """
    if strategy == "ddp" and distributed():
        device_ids = [device.index] if device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        if torch.are_deterministic_algorithms_enabled():
            # DDP checks a hook's annotations against classes; this module's are strings.
            ddp.register_comm_hook(None, lambda group, bucket: rank_ordered_allreduce(group, bucket))
        return ddp
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


def rank_ordered_allreduce(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the mean gradient, each element summed over ranks 0, 1, 2, ... in that order.

    DDP's all-reduce sums an element in an order that depends on where it sits
    in its bucket (ring algorithms chunk the buffer), and DDP rebuilds its
    buckets after its first iteration. So the first step after a resume runs
    on the initial bucket layout where the uninterrupted run used the rebuilt
    one; with more than two ranks the sums differ in the last bits and the
    weights drift apart (measured: 4 gloo ranks, resnet18). Gathering the
    buckets and adding them in rank order makes every sum independent of the
    layout, for world-size times a bucket's memory (deterministic mode only).
    """
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    world = dist.get_world_size(group)
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    future = dist.all_gather(gathered, tensor, group=group, async_op=True).get_future()

    def mean_in_rank_order(_: torch.futures.Future) -> torch.Tensor:
        total = gathered[0].clone()
        for part in gathered[1:]:
            total.add_(part)
        return total.div_(world)

    return future.then(mean_in_rank_order)


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
