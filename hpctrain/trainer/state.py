"""The trainer's state as checkpoint parts, and how fast training goes.

A checkpoint is assembled from named :class:`Stateful` parts (model,
optimizer, scheduler, precision, sampler, strategy state, progress, epoch
sums, RNG), each of which saves and restores itself; :func:`checkpoint_payload`
and :func:`restore_parts` know nothing of the trainer. A payload holds only
tensors, dicts, lists, numbers and strings, so it loads with ``weights_only``.

Format version 1 (unchanged by the move to parts): the top-level keys are the
part names above plus ``format``, ``format_version``, ``world_size``,
``batch_size`` (per process), ``micro_batches`` (per step, each of ``batch_size``: the run's
global batch, kept across a resume on another number of ranks; absent in older checkpoints)
and ``spec``; a part a strategy does not use is None.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hpctrain.errors import TrainingConfigError
from hpctrain.task.rng import gather_rng_states, restore_rank_rng_state
from hpctrain.task.samplers import ResumableDistributedSampler
from hpctrain.trainer.evaluation import CORRECT1, CORRECT5, COUNT, LOSS_SUM, Accuracy, all_reduce_sums, new_sums

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "hpctrain-trainer"
CHECKPOINT_VERSION = 1


class Stateful(Protocol):
    """A checkpoint part (torch's own modules, optimizers and schedulers qualify)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


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
    data_wait_fraction: float | None = None  # of the latest (or current) epoch's train time
    val_top1: float | None = None
    val_top5: float | None = None
    val_loss: float | None = None
    best_val_top1: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, values: dict[str, Any]) -> None:
        fresh = Progress()  # a field the checkpoint lacks starts fresh
        for f in dataclasses.fields(self):
            setattr(self, f.name, values.get(f.name, getattr(fresh, f.name)))

    def record_val(self, val: Accuracy) -> None:
        self.val_top1, self.val_top5, self.val_loss = val.top1, val.top5, val.loss
        if self.best_val_top1 is None or val.top1 > self.best_val_top1:
            self.best_val_top1 = val.top1

    def record_train(self, train: Accuracy, images_per_s: float | None, data_wait_fraction: float | None) -> None:
        self.train_top1, self.train_top5, self.train_loss = train.top1, train.top5, train.loss
        self.train_images_per_s = images_per_s
        if data_wait_fraction is not None:
            self.data_wait_fraction = data_wait_fraction


class EpochSums:
    """This rank's train sums of the current epoch; saving all-reduces them, rank 0 carries them on resume."""

    def __init__(self, device: torch.device, *, is_main: bool) -> None:
        self.device = device
        self.is_main = is_main
        self.sums = new_sums(device)

    def add(self, sums: torch.Tensor) -> None:
        self.sums += sums

    def zero(self) -> None:
        self.sums.zero_()

    def total(self) -> torch.Tensor:
        """Summed over ranks, on the CPU. Collective when distributed."""
        return all_reduce_sums(self.sums).cpu()

    def state_dict(self) -> torch.Tensor:
        return self.total()

    def load_state_dict(self, state: torch.Tensor) -> None:
        if self.is_main:  # rank 0 carries the partial epoch's sums for every rank
            self.sums = state.to(self.device, torch.float64)


class RngStates:
    """Every rank's generator states: gathered to rank 0 on save, each rank's own restored on load."""

    def __init__(self, device: torch.device, *, rank: int, world_size: int) -> None:
        self.device, self.rank, self.world_size = device, rank, world_size

    def state_dict(self) -> list[dict[str, Any]] | None:
        return gather_rng_states(self.device)  # collective; None except on rank 0

    def load_state_dict(self, states: list[dict[str, Any]] | None) -> None:
        restore_rank_rng_state(states, self.rank, self.world_size, self.device)


class SamplerPosition:
    """The train sampler's position matching ``progress``: the next batch to train on."""

    def __init__(self, sampler: ResumableDistributedSampler, progress: Progress, batch_size: int) -> None:
        self.sampler, self.progress, self.batch_size = sampler, progress, batch_size
        self.iter_start = 0  # the step at which the current train iterator started

    def state_dict(self) -> dict[str, int]:
        sampler, progress = self.sampler, self.progress
        state = sampler.state_dict()
        if progress.step_in_epoch == 0 or progress.epoch != sampler.epoch:
            return {**state, "epoch": progress.epoch, "consumed_samples": 0}
        done_here = progress.step_in_epoch - self.iter_start
        return sampler.state_dict(batches_done=done_here, batch_size=self.batch_size)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)


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

    def data_wait_fraction(self) -> float:
        """The share of the wall time since the window started that the loop spent waiting for batches."""
        elapsed = time.perf_counter() - self.started
        return min(1.0, self.data_s / elapsed) if elapsed > 0 else 0.0

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
            "data_wait_fraction": min(1.0, self.data_s / elapsed) if elapsed > 0 else 0.0,
        }


def checkpoint_payload(parts: Mapping[str, Stateful | None], **meta: Any) -> dict[str, Any]:
    """Every part's state under its name (None for an unused part), plus ``meta``.

    Collective when a part's ``state_dict`` is (RNG states, epoch sums): call it on every rank.
    """
    payload: dict[str, Any] = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION}
    for name, part in parts.items():
        payload[name] = part.state_dict() if part is not None else None
    return {**payload, **meta}


def restore_parts(state: dict[str, Any], parts: Mapping[str, Stateful | None], *, source: Path | None) -> list[str]:
    """Load each part from its entry of ``state``, in order; the names of parts the checkpoint lacks."""
    if state.get("format") != CHECKPOINT_FORMAT or state.get("format_version") != CHECKPOINT_VERSION:
        raise TrainingConfigError(
            f"{source} is not an hpctrain trainer checkpoint (format {state.get('format')!r} version "
            f"{state.get('format_version')!r}; this hpctrain reads {CHECKPOINT_FORMAT!r} version {CHECKPOINT_VERSION})",
            hint="start in a new run directory, or move the foreign checkpoints away",
        )
    missing = []
    for name, part in parts.items():
        if part is None:
            continue
        if state.get(name) is None:
            missing.append(name)
            continue
        part.load_state_dict(state[name])
    return missing
