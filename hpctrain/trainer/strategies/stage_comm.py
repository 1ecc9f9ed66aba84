"""The pipeline's ranks and what they exchange outside the schedule.

Rank ``r`` runs stage ``r % stages`` of pipeline (replica) ``r // stages``, so
a pipeline's stages are neighbouring ranks (one node, when a node has that
many tasks) and the replicas of a stage form its data-parallel group. Besides
the schedule's own activation/gradient sends, the ranks exchange: gradients
and buffers within a data-parallel group, a step's loss sums from the last
stage to the first (rank 0 reports them), activations stage to stage during
validation, and every stage's weights for a checkpoint of the whole model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

_HEADER = 8  # ndim + up to 7 dims of an activation sent during validation


@dataclass(frozen=True)
class StageLayout:
    """Where one rank sits: pure arithmetic over (stages, world size, rank)."""

    stages: int
    world_size: int
    rank: int

    @property
    def replicas(self) -> int:
        return self.world_size // self.stages

    @property
    def stage(self) -> int:
        return self.rank % self.stages

    @property
    def replica(self) -> int:
        return self.rank // self.stages

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def pipeline_ranks(self, replica: int) -> list[int]:
        return [replica * self.stages + s for s in range(self.stages)]

    def replica_ranks(self, stage: int) -> list[int]:
        return [r * self.stages + stage for r in range(self.replicas)]

    def rank_of(self, stage: int, replica: int | None = None) -> int:
        return (self.replica if replica is None else replica) * self.stages + stage


@dataclass
class StageGroups:
    """This rank's pipeline group (None: the whole world) and data-parallel group (None: no replicas)."""

    pipeline: dist.ProcessGroup | None
    replicas: dist.ProcessGroup | None
    first_pipeline: dist.ProcessGroup | None  # replica 0's pipeline (gathers optimizer states); None: world


def make_groups(layout: StageLayout) -> StageGroups:
    """Collective: every rank creates every group, in the same order, and keeps its own."""
    if layout.replicas == 1:
        return StageGroups(None, None, None)
    pipelines = [dist.new_group(layout.pipeline_ranks(r)) for r in range(layout.replicas)]
    replicas = [dist.new_group(layout.replica_ranks(s)) for s in range(layout.stages)]
    return StageGroups(pipelines[layout.replica], replicas[layout.stage], pipelines[0])


@torch.no_grad()
def broadcast_tensors(
    tensors: Sequence[torch.Tensor], src: int, device: torch.device, group: dist.ProcessGroup | None = None
) -> None:
    """Give every rank of ``group`` rank ``src``'s values of ``tensors`` (in place; sent flat, per dtype)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors([t.detach().to(device) for t in same])
        dist.broadcast(flat, src=src, group=group)
        for tensor, synced in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            tensor.copy_(synced)


@torch.no_grad()
def average_gradients(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Mean of every gradient over ``group`` (a stage's replicas); no-op without one."""
    if group is None:
        return
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    size = dist.get_world_size(group)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for grad, reduced in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            grad.copy_(reduced)


def sync_replica_buffers(module: nn.Module, layout: StageLayout, groups: StageGroups, device: torch.device) -> None:
    """Every replica of a stage takes replica 0's buffers (BatchNorm statistics), as DDP does before a forward."""
    buffers = list(module.buffers())
    if groups.replicas is not None and buffers:
        broadcast_tensors(buffers, layout.rank_of(layout.stage, replica=0), device, groups.replicas)


def sync_whole_model(parts: Sequence[nn.Module], layout: StageLayout, device: torch.device) -> None:
    """Every rank's copy of every stage becomes that stage's current weights (from replica 0). Collective."""
    for stage, part in enumerate(parts):
        tensors = [*part.parameters(), *part.buffers()]
        if tensors:
            broadcast_tensors(tensors, layout.rank_of(stage, replica=0), device)


def pass_sums_to_first(sums: torch.Tensor, layout: StageLayout) -> torch.Tensor:
    """The last stage's step sums, moved to the first stage (which rank 0 is); zeros on every other stage.

    Summed over all ranks they count every pipeline's batch once, so the trainer's all-reduced
    epoch sums stay exact; rank 0's log lines show its pipeline's loss, as with ddp.
    """
    if layout.is_last:
        dist.send(sums.contiguous(), dst=layout.rank_of(0))
        return torch.zeros_like(sums)
    if layout.is_first:
        dist.recv(sums, src=layout.rank_of(layout.stages - 1))
        return sums
    return torch.zeros_like(sums)


def send_activation(x: torch.Tensor, dst: int) -> None:
    """Validation's stage-to-stage send: shape first (batches may be short), then float32 values."""
    if x.ndim >= _HEADER:
        raise ValueError(f"cannot send a {x.ndim}-d activation")
    header = torch.zeros(_HEADER, dtype=torch.int64, device=x.device)
    header[0] = x.ndim
    header[1 : 1 + x.ndim] = torch.tensor(x.shape, dtype=torch.int64)
    dist.send(header, dst=dst)
    dist.send(x.float().contiguous(), dst=dst)


def recv_activation(src: int, device: torch.device) -> torch.Tensor:
    header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
    dist.recv(header, src=src)
    ndim = int(header[0])
    x = torch.empty(tuple(int(d) for d in header[1 : 1 + ndim]), dtype=torch.float32, device=device)
    dist.recv(x, src=src)
    return x
