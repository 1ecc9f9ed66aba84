"""The one train step, shared by every strategy and by each hogwild worker (with its own optimizer).

A strategy takes part in the step only through :class:`StepHooks`: multi-node
dp broadcasts buffers before the forward and averages gradients after the
backward; DDP does both inside its wrapper, the others need nothing. dp with
``trainer.dp_parallel_loss`` also computes the loss and the accuracy counts
on each GPU (its model returns one output per GPU). A rank that computes several
canonical micro-batches of a step, or pieces of them (a resume on fewer ranks),
accumulates their gradients.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from hpctrain.runtime import heartbeat
from hpctrain.task.step_timer import NoClock, StepClock
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
    plain model inside it; ``clock`` is lapped through the step's parts (``task/step_timer.py``).
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
    clock: StepClock | NoClock = field(default_factory=NoClock)

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step; returns this batch's [correct1, correct5, loss*n, n] on the device."""
        return self.accumulate([(images, targets)])

    def accumulate(
        self,
        batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
        divisors: Sequence[float] | None = None,
        contexts: Sequence[AbstractContextManager[Any]] | None = None,
    ) -> torch.Tensor:
        """One optimizer step on the gradients of several micro-batches (or pieces of them); their summed sums.

        Each part's mean loss is divided by its divisor (default: their count), so that with DDP averaging
        over the ranks the gradient is the mean over the whole global batch (``jobspec/shares.py``,
        docs/preemption.md). ``contexts`` wrap each part's forward (a piece's BatchNorm statistics).
        DDP's all-reduce runs in the last backward only.
        """
        heartbeat.set_phase("forward_backward")  # DDP's all-reduce runs inside the backward
        self.optimizer.zero_grad(set_to_none=True)
        parts = []
        for index, (images, targets) in enumerate(batches):
            last = index == len(batches) - 1
            sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else self.model.no_sync()
            divisor = len(batches) if divisors is None else divisors[index]
            context = contexts[index] if contexts is not None else contextlib.nullcontext()
            images, targets = batch_to_device(images, targets, self.device, channels_last=self.channels_last)
            self.clock.lap("h2d")
            self.hooks.before_forward(self.module)
            self.clock.lap("sync")  # multi-node dp's buffer broadcast: a collective, waits for the slowest rank
            with sync, context:
                with self.precision.autocast():
                    output = self.model(images)
                    loss = self.hooks.loss(self.criterion, output, targets)
                self.clock.lap("forward")
                self.precision.backward(loss if divisor == 1 else loss / divisor, self.optimizer)
                self.clock.backward_done()
            parts.append(self.hooks.sums(output, targets, loss))
        self.hooks.after_backward(self.module)  # dp's own all-reduce of the gradients
        self.clock.lap("comm")
        heartbeat.set_phase("optimizer")
        self.precision.step(self.optimizer)
        self.scheduler.step()
        self.clock.lap("optimizer")
        return functools.reduce(operator.add, parts)
