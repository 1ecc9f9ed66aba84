"""BatchNorm over a micro-batch that several ranks compute in pieces: the whole micro-batch's statistics.

When a run continues on a number of ranks that does not divide its micro-batches, the ones left
over are split into pieces over groups of ranks (``jobspec/shares.py``). BatchNorm normalises
with its batch's statistics, so a piece normalised with its own would train differently from the
whole micro-batch. While a piece runs (:meth:`SplitNorm.part`), every BatchNorm layer in training
mode takes its mean and variance over the whole micro-batch instead: one all-gather of each
rank's (count, mean, M2) in the forward, merged in group order (Chan et al.), and one all-reduce
of (sum dy, sum dy * (x - mean)) in the backward -- what ``torch.nn.SyncBatchNorm`` does for a
whole batch, on CPU (gloo) and GPU alike. Its running statistics are updated once per piece,
with the micro-batch's statistics, as the whole micro-batch's forward would.

Nothing of this exists on a run whose ranks compute whole micro-batches (every run that never
changed shape): no groups, no patched layers, the same kernels. A model without BatchNorm needs
no exchange at all: its samples do not meet before the loss.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hpctrain.jobspec.shares import Part, SharePlan


class SplitNorm:
    """The process groups of ``plan``'s split micro-batches, and ``module``'s BatchNorm layers that use them."""

    def __init__(self, module: nn.Module, plan: SharePlan | None, rank: int) -> None:
        self.group: Any = None  # this rank's process group, while a piece runs
        self._groups: dict[int, Any] = {}
        norms = [m for m in module.modules() if isinstance(m, _BatchNorm)]
        self.active = plan is not None and plan.split and bool(norms)  # BatchNorm layers patched
        if not self.active:
            return
        for index, ranks in enumerate(plan.groups):  # collective: every rank creates every group, in order
            if len(ranks) > 1:
                created = dist.new_group(list(ranks))
                if rank in ranks:
                    self._groups[index] = created
        for norm in norms:
            norm.forward = types.MethodType(_dispatching_forward(self), norm)  # type: ignore[method-assign]

    @contextlib.contextmanager
    def part(self, part: Part) -> Iterator[None]:
        """While ``part``'s forward runs: its group's statistics, when it is a piece of a split micro-batch."""
        group = self._groups.get(part.group) if part.group is not None else None
        self.group = group
        try:
            yield
        finally:
            self.group = None


def _dispatching_forward(split: SplitNorm) -> Any:
    # eager under trainer.compile (a graph break per layer, on a run with pieces only): the group's
    # collectives run as written, and a compiled graph never bakes in which group was active
    @torch.compiler.disable
    def forward(self: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
        if split.group is None or not self.training:
            return type(self).forward(self, x)
        return split_batch_norm(self, x, split.group)

    return forward


def split_batch_norm(norm: _BatchNorm, x: torch.Tensor, group: Any) -> torch.Tensor:
    """``norm`` in training mode on ``x``, one piece of a batch spread over ``group``'s ranks."""
    norm._check_input_dim(x)
    mean, var, total = _group_stats(x, group)
    if norm.track_running_stats and norm.running_mean is not None and norm.running_var is not None:
        factor = 0.0 if norm.momentum is None else norm.momentum
        if norm.num_batches_tracked is not None:
            norm.num_batches_tracked.add_(1)
            factor = 1.0 / float(norm.num_batches_tracked) if norm.momentum is None else norm.momentum
        with torch.no_grad():
            unbiased = var * total / (total - 1).clamp(min=1)
            norm.running_mean.mul_(1 - factor).add_(mean.to(norm.running_mean.dtype), alpha=factor)
            norm.running_var.mul_(1 - factor).add_(unbiased.to(norm.running_var.dtype), alpha=factor)
    invstd = torch.rsqrt(var + norm.eps)
    return _SplitBatchNorm.apply(x, norm.weight, norm.bias, mean, invstd, total, group)


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _dims(x: torch.Tensor) -> list[int]:
    return [0, *range(2, x.dim())]


def _channel_shape(x: torch.Tensor) -> list[int]:
    return [1, -1] + [1] * (x.dim() - 2)


@torch.no_grad()
def _group_stats(x: torch.Tensor, group: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean, biased variance, sample count) per channel over the pieces of every rank of ``group``."""
    values = x.to(_stat_dtype(x))
    channels = x.shape[1]
    count = x.numel() // channels
    mean = values.mean(_dims(x))
    m2 = (values - mean.view(_channel_shape(x))).square().sum(_dims(x))
    mine = torch.cat([mean.new_tensor([count]), mean, m2])
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    stats = torch.stack(gathered)  # group order: the same merge on every rank
    counts, means, m2s = stats[:, :1], stats[:, 1 : channels + 1], stats[:, channels + 1 :]
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    m2 = (m2s + counts * (means - mean).square()).sum(0)
    return mean, m2 / total, total  # total stays on the device: no sync


class _SplitBatchNorm(torch.autograd.Function):
    """y = (x - mean) * invstd * weight + bias, with the gradient of statistics taken over the whole group."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        mean: torch.Tensor,
        invstd: torch.Tensor,
        total: torch.Tensor,
        group: Any,
    ) -> torch.Tensor:
        shape = _channel_shape(x)
        y = (x.to(mean.dtype) - mean.view(shape)) * invstd.view(shape)
        if weight is not None:
            y = y * weight.to(mean.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(mean.dtype).view(shape)
        ctx.save_for_backward(x, weight, mean, invstd)
        ctx.total, ctx.group = total, group
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, mean, invstd = ctx.saved_tensors
        shape, dims = _channel_shape(x), _dims(x)
        dy = grad_out.to(mean.dtype)
        xmu = x.to(mean.dtype) - mean.view(shape)
        sums = torch.cat([dy.sum(dims), (dy * xmu).sum(dims)])
        channels = mean.numel()
        grad_weight = (sums[channels:] * invstd).to(weight.dtype) if weight is not None else None
        grad_bias = None if ctx.bias_dtype is None else sums[:channels].to(ctx.bias_dtype, copy=True)
        dist.all_reduce(sums, group=ctx.group)  # the whole micro-batch's sums
        sum_dy, sum_dy_xmu = sums[:channels], sums[channels:]
        scale = invstd if weight is None else invstd * weight.to(mean.dtype)
        grad_x = dy - (sum_dy / ctx.total).view(shape) - xmu * (invstd.square() * sum_dy_xmu / ctx.total).view(shape)
        grad_x = grad_x * scale.view(shape)
        return grad_x.to(x.dtype), grad_weight, grad_bias, None, None, None, None
