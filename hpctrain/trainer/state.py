"""Where training stands, how fast it goes, and what a trainer checkpoint holds.

``Progress`` is the part of the trainer's state that is plain numbers: it goes
into every checkpoint and (minus the position) into summary.json.
``checkpoint_payload`` assembles a checkpoint from a trainer and
``restore_checkpoint`` puts one back; it holds only tensors, dicts, lists,
numbers and strings, so it loads with ``weights_only``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.evaluation import CORRECT1, CORRECT5, COUNT, LOSS_SUM, Accuracy

if TYPE_CHECKING:
    from hpctrain.trainer.trainer import Trainer

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "hpctrain-trainer"
CHECKPOINT_VERSION = 1


@dataclass
class Progress:
    """Position (next epoch and step to run) and the latest metrics."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epochs_completed: int = 0
    train_top1: float | None = None
    train_top5: float | None = None
    train_loss: float | None = None
    train_images_per_s: float | None = None
    val_top1: float | None = None
    val_top5: float | None = None
    val_loss: float | None = None
    best_val_top1: float | None = None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Progress:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def record_val(self, val: Accuracy) -> None:
        self.val_top1, self.val_top5, self.val_loss = val.top1, val.top5, val.loss
        if self.best_val_top1 is None or val.top1 > self.best_val_top1:
            self.best_val_top1 = val.top1

    def record_train(self, train: Accuracy, images_per_s: float | None) -> None:
        self.train_top1, self.train_top5, self.train_loss = train.top1, train.top5, train.loss
        self.train_images_per_s = images_per_s


class StepWindow:
    """Loss/accuracy sums and timings over the steps since the last log line."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None
        self.steps = 0
        self.images = 0
        self.data_s = 0.0
        self.started = time.perf_counter()

    def add(self, sums: torch.Tensor | None, *, data_s: float, images: int, steps: int = 1) -> None:
        if sums is not None:
            self.sums = sums.detach().clone() if self.sums is None else self.sums + sums
        self.steps += steps
        self.images += images
        self.data_s += data_s

    def images_per_s(self, world_size: int) -> float:
        """Images per second over all ranks (each rank runs the same number of same-size steps)."""
        elapsed = time.perf_counter() - self.started
        return self.images * world_size / elapsed if elapsed > 0 else 0.0

    def values(self, *, world_size: int, lr: float) -> dict[str, float]:
        """The log-line values; reading the sums waits for the device, so the timings are real."""
        sums = self.sums.tolist() if self.sums is not None else [0.0, 0.0, 0.0, 0.0]
        count = max(1.0, sums[COUNT])
        elapsed = time.perf_counter() - self.started
        steps = max(1, self.steps)
        return {
            "loss": sums[LOSS_SUM] / count,
            "lr": lr,
            "top1": 100.0 * sums[CORRECT1] / count,
            "top5": 100.0 * sums[CORRECT5] / count,
            "images_per_s": self.images * world_size / elapsed if elapsed > 0 else 0.0,
            "data_s": self.data_s / steps,
            "step_s": elapsed / steps,
        }


def checkpoint_payload(trainer: Trainer, *, rng: list[dict[str, Any]] | None, epoch_sums: torch.Tensor) -> dict:
    """Everything needed to continue ``trainer`` at exactly this step."""
    hogwild = trainer.hogwild
    return {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_VERSION,
        "model": trainer.module.state_dict(),
        "optimizer": trainer.optimizer.state_dict() if hogwild is None else None,
        "scheduler": trainer.scheduler.state_dict() if hogwild is None else None,
        "precision": trainer.precision.state_dict(),
        "sampler": sampler_state(trainer) if hogwild is None else None,
        "hogwild": hogwild.state_dict() if hogwild is not None else None,
        "progress": asdict(trainer.progress),
        "epoch_sums": epoch_sums,
        "rng": rng,
        "world_size": trainer.env.world_size,
        "batch_size": trainer.batch_size,
        "spec": json.dumps(trainer.ctx.spec.model_dump(mode="json"), sort_keys=True),
    }


def restore_checkpoint(trainer: Trainer, state: dict[str, Any], *, model_only: bool = False) -> None:
    """Put a checkpoint back into ``trainer`` (the inverse of :func:`checkpoint_payload`)."""
    if state.get("format") != CHECKPOINT_FORMAT:
        raise TrainingConfigError(
            f"{trainer.checkpoints.last_loaded} is not an hpctrain trainer checkpoint",
            hint="start in a new run directory, or move the foreign checkpoints away",
        )
    trainer.module.load_state_dict(state["model"])
    trainer.progress = Progress.from_dict(state["progress"])
    if model_only:
        return
    if trainer.hogwild is not None and state.get("hogwild") is not None:
        trainer.hogwild.load_state_dict(state["hogwild"])
    elif trainer.hogwild is None and state.get("optimizer") is not None:
        trainer.optimizer.load_state_dict(state["optimizer"])
        trainer.scheduler.load_state_dict(state["scheduler"])
        trainer.loaders.train_sampler.load_state_dict(state["sampler"])
    else:
        log.warning(
            "the checkpoint was written by another strategy than %s: weights and position are restored, "
            "optimizer state starts fresh and a partial epoch restarts from its beginning",
            trainer.cfg.strategy,
        )
    trainer.precision.load_state_dict(state["precision"])
    if trainer.ctx.is_main:  # rank 0 carries the partial epoch's sums for every rank
        trainer.epoch_sums = state["epoch_sums"].to(trainer.device, torch.float64)


def sampler_state(trainer: Trainer) -> dict[str, int]:
    """The train sampler's position matching ``trainer.progress`` (the next batch to train on)."""
    sampler, progress = trainer.loaders.train_sampler, trainer.progress
    state = sampler.state_dict()
    if progress.step_in_epoch == 0 or progress.epoch != sampler.epoch:
        return {**state, "epoch": progress.epoch, "consumed_samples": 0}
    done_here = progress.step_in_epoch - trainer.iter_start
    return sampler.state_dict(batches_done=done_here, batch_size=trainer.batch_size)
