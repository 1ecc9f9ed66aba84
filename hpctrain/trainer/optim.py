"""SGD and its learning-rate schedule, as in the ImageNet references.

The schedule is a ``LambdaLR`` stepped once per optimizer step (not per epoch),
so warmup is smooth and a mid-epoch resume restores the exact rate. Its factor
is a closure rather than an object, so ``LambdaLR.state_dict`` stores only the
step count: a resumed run recomputes the factor from its own spec and
steps-per-epoch instead of restoring stale ones.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

import torch
from torch import nn

from hpctrain.jobspec.batch import REFERENCE_BATCH, scaled_lr  # noqa: F401 - torch-free, re-exported
from hpctrain.jobspec.models import Trainer

_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,  # BatchNorm*, SyncBatchNorm, InstanceNorm*
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


def parameter_groups(model: nn.Module, weight_decay: float, no_decay_on_norm: bool) -> list[dict]:
    """One group, or two when norm-layer parameters and biases are exempt from weight decay."""
    if not no_decay_on_norm:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            exempt = isinstance(module, _NORM_TYPES) or name == "bias"
            (no_decay if exempt else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(
    model: nn.Module, trainer_spec: Trainer, global_batch_size: int, *, only: set[int] | None = None
) -> torch.optim.SGD:
    """SGD with one fused kernel over all parameters where torch has one for their device, else foreach.

    The fused step also takes fp16's found-inf flag on the device, so a GradScaler step needs no host sync.
    ``only`` (ids of parameters) keeps a shard of the model's parameters, in the same groups (ps servers).
    """
    groups = parameter_groups(model, trainer_spec.weight_decay, trainer_spec.no_weight_decay_on_norm)
    if only is not None:
        groups = [{**g, "params": [p for p in g["params"] if id(p) in only]} for g in groups]
        groups = [g for g in groups if g["params"]]
    settings = {
        "lr": scaled_lr(trainer_spec, global_batch_size),
        "momentum": trainer_spec.momentum,
        "weight_decay": trainer_spec.weight_decay,
    }
    try:
        return torch.optim.SGD(groups, **settings, fused=True)
    except RuntimeError:  # no fused SGD for this device or dtype
        return torch.optim.SGD(groups, **settings, foreach=True)


def lr_factor(trainer_spec: Trainer, steps_per_epoch: int) -> Callable[[int], float]:
    """Multiplier of the base rate after ``step`` optimizer steps."""
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be at least 1 (got {steps_per_epoch})")
    total = trainer_spec.epochs * steps_per_epoch
    warmup = min(total, round(trainer_spec.warmup_epochs * steps_per_epoch))
    milestones = [epoch * steps_per_epoch for epoch in trainer_spec.step_epochs]
    schedule, gamma = trainer_spec.schedule, trainer_spec.step_gamma

    def factor(step: int) -> float:
        if schedule == "step":
            value = gamma ** bisect.bisect_right(milestones, step)
        elif schedule == "cosine":
            progress = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
            value = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            value = 1.0
        if step < warmup:  # linear ramp: 1/warmup of the rate on the first step, full rate after warmup
            value *= (step + 1) / warmup
        return value

    return factor


def build_scheduler(
    optimizer: torch.optim.Optimizer, trainer_spec: Trainer, steps_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Call ``scheduler.step()`` after every optimizer step that was taken."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(trainer_spec, steps_per_epoch))
