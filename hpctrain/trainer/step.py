"""The one train step, shared by every strategy and by each hogwild worker (with its own optimizer).

A strategy takes part in the step only through :class:`StepHooks`: multi-node
dp broadcasts buffers before the forward and averages gradients after the
backward; DDP does both inside its wrapper, the others need nothing. dp with
``trainer.dp_parallel_loss`` also computes the loss and the accuracy counts
on each GPU (its model returns one output per GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from hpctrain.runtime import heartbeat
from hpctrain.trainer.batches import batch_to_device
from hpctrain.trainer.precision import Precision


class StepHooks(Protocol):
    """A strategy's share of a train step (both are no-ops for most strategies)."""

    def before_forward(self, module: nn.Module) -> None: ...

    def after_backward(self, module: nn.Module) -> None: ...

    def loss(self, criterion: nn.Module, output: Any, targets: torch.Tensor) -> torch.Tensor: ...

    def sums(self, output: Any, targets: torch.Tensor, loss: torch.Tensor) -> torch.Tensor: ...


@dataclass
class TrainStep:
    """Forward, backward and optimizer step of ``model`` on one batch; call it with (images, targets).

    ``model`` is what the forward runs (the strategy's wrapper), ``module`` the
    plain model inside it.
    """

    model: nn.Module
    module: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    criterion: nn.Module
    hooks: StepHooks
    device: torch.device
    channels_last: bool = False

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step; returns this batch's [correct1, correct5, loss*n, n] on the device."""
        heartbeat.set_phase("forward_backward")  # DDP's all-reduce runs inside the backward
        images, targets = batch_to_device(images, targets, self.device, channels_last=self.channels_last)
        self.hooks.before_forward(self.module)
        with self.precision.autocast():
            output = self.model(images)
            loss = self.hooks.loss(self.criterion, output, targets)
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.backward(loss, self.optimizer)
        self.hooks.after_backward(self.module)
        heartbeat.set_phase("optimizer")
        self.precision.step(self.optimizer)
        self.scheduler.step()
        return self.hooks.sums(output, targets, loss)
