"""Process-group helpers the strategies and the trainer share; all are no-ops without a group."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


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
