"""BatchNorm over a micro-batch that several ranks compute in pieces: the whole micro-batch's statistics.

When a run continues on a number of ranks that does not divide its micro-batches, the ones left
over are split into pieces over groups of ranks (``jobspec/shares.py``). BatchNorm normalises
with its batch's statistics, so a piece normalised with its own would train differently from the
whole micro-batch. While a piece runs (:meth:`SplitNorm.part`), every BatchNorm layer in training
mode takes its mean and variance over the whole micro-batch instead: one all-gather of each
rank's (count, mean, M2) in the forward, merged in group order (Chan et al.), and one all-reduce
of (sum dy, sum dy * (x - mean)) in the backward -- what ``torch.nn.SyncBatchNorm`` does for a
whole batch, on CPU (gloo) and GPU alike.

The running statistics follow the full shape's: there rank r computed micro-batch r alone, so its
running statistics were updated once a step, with micro-batch r's (and DDP broadcasts rank 0's to
every rank at each step's first forward). On any other shape rank r still computes micro-batch r
whole (``jobspec/shares.py``), and only that part updates them; a rank's other parts (more whole
micro-batches, a piece) normalise with their batch's statistics and leave the running ones alone.
Without this a rank of a whole micro-batch and a piece moved them twice a step: 13 % off the
undisturbed run's after one step (issue 42, item 8).

Nothing of this exists on a run that never changed shape: no groups, no patched layers, the same
kernels. A model without BatchNorm needs no exchange at all: its samples do not meet before the loss.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hpctrain.jobspec.shares import Part, SharePlan


class SplitNorm:
    """The process groups of ``plan``'s split micro-batches, and ``module``'s BatchNorm layers that use them."""

    def __init__(self, module: nn.Module, plan: SharePlan | None, rank: int) -> None:
        self.group: Any = None  # this rank's process group, while a piece runs
        self.tracks = True  # whether the part running updates the running statistics (the canonical one)
        self.rank = rank
        self._groups: dict[int, Any] = {}
        norms = [m for m in module.modules() if isinstance(m, _BatchNorm)]
        self.active = plan is not None and bool(norms)  # BatchNorm layers patched: the shape changed
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
        """While ``part``'s forward runs: its group's statistics, when it is a piece of a split micro-batch;
        the running statistics updated only when it is the micro-batch this rank computed in the full shape."""
        group = self._groups.get(part.group) if part.group is not None else None
        self.group, self.tracks = group, part.micro_batch == self.rank
        try:
            yield
        finally:
            self.group, self.tracks = None, True


def _dispatching_forward(split: SplitNorm) -> Any:
    # eager under trainer.compile (a graph break per layer, on a run with pieces only): the group's
    # collectives run as written, and a compiled graph never bakes in which group was active
    @torch.compiler.disable
    def forward(self: _BatchNorm, x: torch.Tensor) -> torch.Tensor:
        if not self.training or (split.group is None and split.tracks):
            return type(self).forward(self, x)
        if split.group is None:  # a whole micro-batch another rank computed in the full shape
            self._check_input_dim(x)
            return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)
        return split_batch_norm(self, x, split.group)

    return forward


def split_batch_norm(norm: _BatchNorm, x: torch.Tensor, group: Any) -> torch.Tensor:
    """``norm`` in training mode on ``x``, one piece of a batch spread over ``group``'s ranks.

    Its running statistics stay as they are: a piece is never of the micro-batch its rank computed in the
    full shape (micro-batches left over are numbered from the ranks' count up, ``jobspec/shares.py``).
    """
    norm._check_input_dim(x)
    mean, var, total = _group_stats(x, group)
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
