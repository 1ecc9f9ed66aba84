"""The work of a run in optimizer steps, at each shape, and where that count came from. Pure.

``trainer.batch_size`` is per device, so a shape with more nodes has a larger
global batch and fewer steps per epoch: the work is the samples of an epoch
(measured by an earlier run of this spec, or the user's ``--samples-per-epoch``)
divided by the shape's global batch, times ``trainer.epochs``, capped by
``trainer.max_steps_per_epoch``. A user's ``--steps`` (a script job's own
loop) is the same at every shape. Where nothing gives a count, :class:`NoStepCount`
says what is missing and how to give it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.errors import UsageError


class NoStepCount(UsageError):
    """The spec and its earlier runs do not say how many steps the run has."""


@dataclass(frozen=True)
class Work:
    """How much a run trains: ``total_steps`` fixed, or ``epochs`` x (``samples_per_epoch`` / global batch)."""

    epochs: int
    samples_per_epoch: int | None = None
    max_steps_per_epoch: int | None = None
    total_steps: int | None = None
    source: str = ""  # where the count came from, in words

    def steps_at(self, global_batch: int) -> int:
        """Optimizer steps of the whole run when each step takes ``global_batch`` samples."""
        if self.total_steps is not None:
            return self.total_steps
        if self.samples_per_epoch is not None:
            per_epoch = max(1, math.ceil(self.samples_per_epoch / max(1, global_batch)))
            if self.max_steps_per_epoch is not None:
                per_epoch = min(per_epoch, self.max_steps_per_epoch)
        elif self.max_steps_per_epoch is not None:
            per_epoch = self.max_steps_per_epoch
        else:
            raise NoStepCount("no step count")  # work_of never builds such a Work
        return self.epochs * per_epoch


def work_of(
    *,
    spec_name: str,
    runs_trainer: bool,
    epochs: int,
    max_steps_per_epoch: int | None,
    steps: int | None = None,
    samples_per_epoch: int | None = None,
    measured_samples: tuple[int, str] | None = None,
    measured_total_steps: tuple[int, str] | None = None,
) -> Work:
    """The run's work from the best source: the user's ``--steps`` / ``--samples-per-epoch``, an earlier
    run's epoch (``measured_samples``: (samples, which run)) or total, the spec's own cap; else NoStepCount."""
    if steps is not None:
        return Work(epochs, total_steps=steps, source=f"--steps {steps:,} (yours)")
    if not runs_trainer:
        if measured_total_steps is not None:
            total, where = measured_total_steps
            return Work(epochs, total_steps=total, source=f"{total:,} steps, as recorded by {where}")
        raise NoStepCount(
            f"{spec_name}: no step count: a script or entry point counts its own steps, and no earlier run of "
            "this spec recorded a total",
            hint="give --steps N (the run's optimizer steps); its step time: --step-time S, or an earlier run",
        )
    if samples_per_epoch is not None:
        return Work(epochs, samples_per_epoch, max_steps_per_epoch, source=f"--samples-per-epoch {samples_per_epoch:,}")
    if measured_samples is not None:
        samples, where = measured_samples
        return Work(epochs, samples, max_steps_per_epoch, source=f"about {samples:,} samples an epoch, from {where}")
    if max_steps_per_epoch is not None:
        return Work(
            epochs,
            max_steps_per_epoch=max_steps_per_epoch,
            source=f"trainer.max_steps_per_epoch {max_steps_per_epoch:,} (a cap: a smaller data set gives fewer)",
        )
    raise NoStepCount(
        f"{spec_name}: no step count: trainer.epochs is {epochs}, but the steps of an epoch are unknown (no "
        "earlier run of this spec recorded them, and trainer.max_steps_per_epoch is not set)",
        hint="give --samples-per-epoch N (the training images), or --steps N, or run the spec once",
    )
