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

Nothing in a checkpoint but its tensors' values is trusted on resume: :func:`check_fields` judges every
other field against the run (:class:`RunShape`: the spec, this job's layout and, once built, the data)
before a tensor is allocated, and names the first that does not fit in a ``CheckpointError``; the
checkpoint manager then falls back to the previous checkpoint (``trainer/checkpoint.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from hpctrain.errors import CheckpointError, TrainingConfigError
from hpctrain.jobspec.batch import MAX_ACCUMULATION, micro_batch_problem
from hpctrain.jobspec.fields import shown_value
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


# -- what a checkpoint of this run may say ---------------------------------------------------------------------
MAX_WORLD_SIZE = 4096 * 256  # resources.nodes x resources.tasks_per_node at most
STATE_SLACK_BYTES = 64 << 20  # epoch sums, a scaler, buffers: far less
RNG_BYTES_PER_RANK = 1 << 20  # torch's CPU state is 5 KiB, CUDA's a few bytes per device
_PERCENT = ("train_top1", "train_top5", "val_top1", "val_top5", "best_val_top1")


@dataclass(frozen=True)
class RunShape:
    """What a trainer checkpoint of this run must fit. The data-dependent bounds are None until the data is built."""

    epochs: int | None  # trainer.epochs (None: evaluating another run's checkpoint, whose epochs are its own)
    per_process: int  # images one process's loader yields per step
    processes: int  # processes of this job that each load a batch per step
    strategy: str
    micro_batches: int | None  # the run's global batch in micro-batches, when on record (healing, run.json)
    steps_per_epoch: int | None = None  # optimizer steps per epoch, once the data is built
    trains_itself: bool = True  # the trainer runs the epochs (hogwild's workers keep their own positions)
    evaluates_only: bool = False  # trainer.evaluate_only: only the model and progress are restored


def recorded_micro_batches(told: str | None, run_info: Mapping[str, Any] | None, per_process: int) -> int | None:
    """The run's global batch in micro-batches as recorded outside any checkpoint, or None: a step on fewer
    nodes is told it (``RUN_MICRO_BATCHES_VAR``), and ``run.json`` keeps the global batch of the first submit."""
    if told and told.isdigit():
        return int(told)
    recorded = (run_info or {}).get("global_batch_size")
    if isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 1 or recorded % per_process:
        return None
    return recorded // per_process


def state_budget(model_bytes: int, *, optimizer_copies: int, world_size: int) -> int:
    """The most tensor data a checkpoint of this run may hold: the model, ``optimizer_copies`` optimizer
    states of at most three slots each (SGD's momentum, Adam's moments), every rank's RNG states, and room
    for the small parts. A checkpoint beyond it is not this run's, and is refused before it is allocated."""
    return model_bytes * (1 + 3 * optimizer_copies) + STATE_SLACK_BYTES + world_size * RNG_BYTES_PER_RANK


def check_fields(state: Mapping[str, Any], meta: Mapping[str, Any] | None, run: RunShape) -> None:
    """Raise ``CheckpointError`` naming the first field of a trainer checkpoint that cannot be this run's.

    ``state`` is the checkpoint as read onto the meta device (its tensors have sizes, no values);
    ``meta``: its folder's ``meta.json``. A checkpoint of another format is left to :func:`restore_parts`.
    """
    if state.get("format") != CHECKPOINT_FORMAT or state.get("format_version") != CHECKPOINT_VERSION:
        return
    if not run.evaluates_only:  # the layout matters only to a run that trains on
        _check_layout(state, run)
    progress = state.get("progress")
    if progress is None:
        return
    if not isinstance(progress, Mapping):
        raise CheckpointError(f"progress is a {type(progress).__name__}, not the run's position")
    why = f"trainer.epochs is {run.epochs}" if run.epochs is not None else ""
    epoch = _whole("progress.epoch", progress.get("epoch", 0), 0, run.epochs, why)
    _whole("progress.epochs_completed", progress.get("epochs_completed", 0), 0, run.epochs)
    step = _whole("progress.global_step", progress.get("global_step", 0), 0, None)
    if meta is not None and isinstance(meta.get("global_step"), int) and meta["global_step"] != step:
        raise CheckpointError(f"progress.global_step is {step}, but its folder was saved at step {meta['global_step']}")
    for name in (*_PERCENT, "train_loss", "val_loss", "train_images_per_s", "data_wait_fraction"):
        _check_measure(f"progress.{name}", progress.get(name), name)
    in_epoch = _whole("progress.step_in_epoch", progress.get("step_in_epoch", 0), 0, run.steps_per_epoch)
    if run.steps_per_epoch is not None and run.trains_itself and not run.evaluates_only:
        most = (epoch + 1) * run.steps_per_epoch
        if step > most:
            raise CheckpointError(
                f"progress.global_step is {step}, more than {most} ({epoch + 1} epochs of {run.steps_per_epoch} steps)"
            )
        _check_sampler(state.get("sampler"), epoch, in_epoch, run)
    if not run.evaluates_only:
        _check_scheduler(state.get("scheduler"), step, run)
        sums = state.get("epoch_sums")
        if isinstance(sums, torch.Tensor) and sums.numel() != 4:
            raise CheckpointError(f"epoch_sums holds {sums.numel()} values, not 4")


def _check_layout(state: Mapping[str, Any], run: RunShape) -> None:
    """The saving job's world, per-process batch and the run's global batch in micro-batches."""
    world = state.get("world_size")
    if world is not None:
        _whole("world_size", world, 1, MAX_WORLD_SIZE)
    batch = state.get("batch_size")
    if batch is not None and batch != run.per_process:
        raise CheckpointError(f"batch_size is {shown_value(batch)}, but this run's processes load {run.per_process}")
    _check_micro_batches(state.get("micro_batches"), run)


def _check_micro_batches(value: Any, run: RunShape) -> None:
    if value is None:
        return  # written before the field existed: elastic.run_micro_batches decides from world_size
    _whole("micro_batches", value, 1, MAX_WORLD_SIZE)
    if run.micro_batches is not None and value != run.micro_batches:
        raise CheckpointError(
            f"micro_batches is {value}, but this run's global batch is {run.micro_batches} "
            f"micro-batch{'es' * (run.micro_batches != 1)} of {run.per_process} "
            f"({run.micro_batches * run.per_process} images per step)"
        )
    problem = micro_batch_problem(value, run.processes, strategy=run.strategy)
    if problem is None and value > run.processes * MAX_ACCUMULATION:
        problem = f"{value // run.processes}-way accumulation per rank (at most {MAX_ACCUMULATION})"
    if problem is not None:
        raise CheckpointError(f"micro_batches is {value}: {problem}")


def _check_sampler(sampler: Any, epoch: int, in_epoch: int, run: RunShape) -> None:
    """The train sampler's position is the progress's: ``step_in_epoch`` steps of the run's global batch."""
    if sampler is None:
        return
    if not isinstance(sampler, Mapping):
        raise CheckpointError(f"sampler is a {type(sampler).__name__}, not a position")
    _whole("sampler.epoch", sampler.get("epoch"), epoch, epoch, f"progress.epoch is {epoch}")
    micro = run.micro_batches or run.processes
    expected = in_epoch * run.per_process * micro
    consumed = _whole("sampler.consumed_samples", sampler.get("consumed_samples"), 0, None)
    if consumed != expected:
        raise CheckpointError(
            f"sampler.consumed_samples is {consumed}, but progress.step_in_epoch {in_epoch} means {expected} "
            f"({in_epoch} steps of {micro} x {run.per_process} images)"
        )


def _check_scheduler(scheduler: Any, step: int, run: RunShape) -> None:
    if not isinstance(scheduler, Mapping) or "last_epoch" not in scheduler:
        return
    most = (step + 1) * max(1, run.processes)  # an asynchronous parameter server steps once per worker gradient
    _whole("scheduler.last_epoch", scheduler["last_epoch"], -1, most, f"the run took {step} steps")


def _check_measure(key: str, value: Any, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CheckpointError(f"{key} is {shown_value(value)}, not a finite number")
    high = 100.0 if name in _PERCENT else 1.0 if name == "data_wait_fraction" else math.inf
    if not 0.0 <= value <= high or (name.endswith("_loss") and value > 1e12):
        raise CheckpointError(f"{key} is {shown_value(value)}, outside what a run can measure")


def _whole(key: str, value: Any, low: int, high: int | None, why: str = "") -> int:
    """``value`` when it is a whole number in [low, high]; else CheckpointError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{key} is {shown_value(value)}, not a whole number")
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise CheckpointError(f"{key} is {value}; a checkpoint of this run has {bound}" + (f" ({why})" if why else ""))
    return value
