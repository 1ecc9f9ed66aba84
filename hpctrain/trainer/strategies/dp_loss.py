"""dp's parallel loss (``trainer.dp_parallel_loss``): each GPU keeps its outputs and computes its own loss.

Plain ``nn.DataParallel`` gathers every replica's output onto the first GPU
and computes the loss there, so GPU 0 holds the whole batch's logits (and their
gradient) on top of its own share of activations. Following PyTorch-Encoding's
``DataParallelModel`` / ``DataParallelCriterion``, :class:`DataParallelModel`
returns the replicas' outputs where they were computed, and
:func:`parallel_loss` scatters the targets the same way, runs one replica of
the criterion per GPU and reduces only the per-GPU loss scalars onto GPU 0.

The reduction weights each GPU's mean loss by its share of the batch, so the
loss (and every gradient) equals plain dp's mean over the whole batch, also
when the last chunk is smaller. With one GPU or none, DataParallel calls the
model directly and everything here is the plain path.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import parallel_apply, replicate

from hpctrain.trainer.evaluation import batch_sums

Outputs = torch.Tensor | Sequence[torch.Tensor]


class DataParallelModel(nn.DataParallel):
    """``nn.DataParallel`` that, while training, leaves each replica's output on its GPU (a tuple).

    In eval mode it gathers like ``nn.DataParallel``: validation keeps no
    autograd graph, and the evaluation code expects one tensor.
    """

    def gather(self, outputs: Any, output_device: Any) -> Any:
        if self.training and torch.is_grad_enabled():
            return tuple(outputs)
        return super().gather(outputs, output_device)


def scatter_like(targets: torch.Tensor, outputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``targets`` cut into the outputs' batch sizes, each on its output's device.

    DataParallel scatters the inputs in order along dim 0, so consecutive
    slices of the targets belong to consecutive outputs.
    """
    sizes = [output.shape[0] for output in outputs]
    if sum(sizes) != targets.shape[0]:
        raise ValueError(f"outputs hold {sum(sizes)} samples but there are {targets.shape[0]} targets")
    parts = targets.split(sizes)
    return [part.to(output.device, non_blocking=True) for part, output in zip(parts, outputs, strict=True)]


def parallel_loss(criterion: nn.Module, outputs: Outputs, targets: torch.Tensor) -> torch.Tensor:
    """The batch's mean loss, computed per GPU and reduced to ``targets``' device (a plain call for one tensor).

    ``criterion`` must be a plain mean over samples (``reduction="mean"``, no
    class weights, as the trainer's CrossEntropyLoss is); the per-GPU means
    are weighted by their share of the batch.
    """
    if isinstance(outputs, torch.Tensor):
        return criterion(outputs, targets)
    parts = scatter_like(targets, outputs)
    pairs = list(zip(outputs, parts, strict=True))
    devices = [output.device for output in outputs]
    if all(device.type == "cuda" for device in devices):
        stateless = next(itertools.chain(criterion.parameters(), criterion.buffers()), None) is None
        replicas = [criterion] * len(devices) if stateless else replicate(criterion, devices)
        losses = parallel_apply(replicas, pairs, devices=devices)
    else:  # parallel_apply is CUDA-only; a loop gives the same numbers (the unit tests use it)
        losses = [criterion(output, part) for output, part in pairs]
    total = targets.shape[0]
    weighted = [loss.to(targets.device) * (part.shape[0] / total) for loss, part in zip(losses, parts, strict=True)]
    return torch.stack(weighted).sum()


def parallel_sums(outputs: Outputs, targets: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """[correct1, correct5, loss*n, n] of the batch: top-k counted on each GPU, summed on ``targets``' device.

    ``loss`` is the reduced mean loss, so the loss entry is ``loss * n`` as on the plain path.
    """
    if isinstance(outputs, torch.Tensor):
        return batch_sums(outputs.float(), targets, loss.float())
    parts = scatter_like(targets, outputs)
    sums = [
        batch_sums(output.float(), part, torch.zeros((), device=output.device)).to(targets.device)
        for output, part in zip(outputs, parts, strict=True)
    ]
    total = torch.stack(sums).sum(dim=0)
    total[2] = loss.detach().to(torch.float64) * targets.shape[0]
    return total
