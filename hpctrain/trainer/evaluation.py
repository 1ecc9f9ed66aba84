"""Exact accuracy: counts, not averages of per-rank percentages.

Each rank validates its own shard (the val sampler partitions the set with no
padding, so shards may differ in size); the ranks then all-reduce the sums of
correct@1, correct@5, loss and sample count. The result is the accuracy over
the whole validation set, whatever the number of ranks. Training-epoch
accuracy is summed the same way.

A validation sample whose image could not be decoded arrives labelled
``SKIPPED_LABEL``: it is scored by no one (no other image takes its place, so
none counts twice) and counted in ``Accuracy.skipped``.
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
from hpctrain.trainer.data.datasets import SKIPPED_LABEL
from hpctrain.trainer.precision import Precision

# Order of the entries in a sums tensor; validation adds SKIPPED.
CORRECT1, CORRECT5, LOSS_SUM, COUNT, SKIPPED = range(5)


@dataclass(frozen=True)
class Accuracy:
    """Percentages and mean loss over ``samples`` samples; ``skipped`` validation samples could not be decoded."""

    top1: float
    top5: float
    loss: float
    samples: int
    skipped: int = 0

    @classmethod
    def from_sums(cls, sums: torch.Tensor) -> Accuracy:
        values = [float(v) for v in sums.tolist()]
        correct1, correct5, loss_sum, count = values[:4]
        skipped = int(values[SKIPPED]) if len(values) > SKIPPED else 0
        if count == 0:
            return cls(0.0, 0.0, 0.0, 0, skipped)
        return cls(100.0 * correct1 / count, 100.0 * correct5 / count, loss_sum / count, int(count), skipped)

    def as_dict(self, prefix: str = "") -> dict[str, Any]:
        values = {f"{prefix}top1": self.top1, f"{prefix}top5": self.top5, f"{prefix}loss": self.loss}
        if self.skipped:
            values[f"{prefix}skipped"] = self.skipped
        return values


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


def new_val_sums(device: torch.device) -> torch.Tensor:
    return torch.zeros(5, dtype=torch.float64, device=device)


def val_batch_sums(
    output: torch.Tensor, targets: torch.Tensor, kept: torch.Tensor, criterion: nn.Module
) -> torch.Tensor:
    """[correct@1, correct@k, loss * n, n, skipped] of one validation batch, scoring only the ``kept`` samples.

    ``kept`` is the CPU mask ``labels != SKIPPED_LABEL`` taken before the copy to the device, so
    a batch without skips (nearly all) costs no host sync. Call under the precision's autocast.
    """
    skipped = int(kept.numel() - int(kept.sum()))
    sums = new_val_sums(output.device)
    if skipped:
        index = kept.nonzero().squeeze(1).to(output.device, non_blocking=True)
        output, targets = output.index_select(0, index), targets.index_select(0, index)
        sums[SKIPPED] = skipped
    if targets.shape[0]:
        sums[:SKIPPED] = batch_sums(output.float(), targets, criterion(output, targets).float())
    return sums


def kept_samples(targets: torch.Tensor) -> torch.Tensor:
    """The CPU mask of validation samples to score (see ``val_batch_sums``)."""
    return targets != SKIPPED_LABEL


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
    sums = new_val_sums(device)
    try:
        for images, targets in batches:
            kept = kept_samples(targets)
            images, targets = batch_to_device(images, targets, device, channels_last=channels_last)
            with precision.autocast():
                output = model(images)
                sums += val_batch_sums(output, targets, kept, criterion)
            heartbeat.beat()
    finally:
        model.train(was_training)
    return Accuracy.from_sums(all_reduce_sums(sums).cpu())
