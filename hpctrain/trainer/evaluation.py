"""Exact accuracy: counts, not averages of per-rank percentages.

Each rank validates its own shard (the val sampler partitions the set with no
padding, so shards may differ in size); the ranks then all-reduce the sums of
correct@1, correct@5, loss and sample count. The result is the accuracy over
the whole validation set, whatever the number of ranks. Training-epoch
accuracy is summed the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.runtime import heartbeat
from hpctrain.trainer.batches import batch_to_device
from hpctrain.trainer.precision import Precision

# Order of the entries in a sums tensor.
CORRECT1, CORRECT5, LOSS_SUM, COUNT = range(4)


@dataclass(frozen=True)
class Accuracy:
    """Percentages and mean loss over ``samples`` samples."""

    top1: float
    top5: float
    loss: float
    samples: int

    @classmethod
    def from_sums(cls, sums: torch.Tensor) -> Accuracy:
        correct1, correct5, loss_sum, count = (float(v) for v in sums.tolist())
        if count == 0:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(100.0 * correct1 / count, 100.0 * correct5 / count, loss_sum / count, int(count))

    def as_dict(self, prefix: str = "") -> dict[str, Any]:
        return {f"{prefix}top1": self.top1, f"{prefix}top5": self.top5, f"{prefix}loss": self.loss}


def new_sums(device: torch.device) -> torch.Tensor:
    return torch.zeros(4, dtype=torch.float64, device=device)


def batch_sums(output: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    """[correct@1, correct@k, loss * n, n] for one batch, without a host sync (k = min(5, classes))."""
    k = min(5, output.shape[1])
    top = output.detach().topk(k, dim=1).indices
    hits = top.eq(target.view(-1, 1))
    n = target.shape[0]
    return torch.stack(
        [
            hits[:, :1].any(dim=1).sum().to(torch.float64),
            hits.any(dim=1).sum().to(torch.float64),
            loss.detach().to(torch.float64) * n,
            torch.tensor(n, dtype=torch.float64, device=output.device),
        ]
    )


def all_reduce_sums(sums: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (a copy; a no-op without a process group). Collective when distributed."""
    total = sums.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    *,
    device: torch.device,
    precision: Precision,
    criterion: nn.Module,
    channels_last: bool = False,
) -> Accuracy:
    """Top-1/top-5 and loss of ``model`` over every rank's ``batches`` together.

    Pass the unwrapped model: a DDP forward is a collective, and ranks may hold
    different numbers of validation batches.
    """
    was_training = model.training
    model.eval()
    sums = new_sums(device)
    try:
        for images, targets in batches:
            images, targets = batch_to_device(images, targets, device, channels_last=channels_last)
            with precision.autocast():
                output = model(images)
                loss = criterion(output, targets)
            sums += batch_sums(output.float(), targets, loss.float())
            heartbeat.beat()
    finally:
        model.train(was_training)
    return Accuracy.from_sums(all_reduce_sums(sums).cpu())
