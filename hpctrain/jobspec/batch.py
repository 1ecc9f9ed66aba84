"""The one definition of the global batch, shared by ``hpctrain validate``, the trainer and hogwild.

``trainer.batch_size`` is what one device computes on per step: one GPU, or
the CPU of a CPU process. A process's loader yields ``per_process`` images
(dp spreads them over the GPUs of its task), and one optimizer step of the
whole job takes ``global_batch`` images (hogwild: one step of every worker;
ps: one batch of every worker task, the parameter servers load nothing).
Torch-free, so login-node commands can use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hpctrain.jobspec.strategy_traits import ELASTIC_STRATEGIES, traits

if TYPE_CHECKING:
    from hpctrain.jobspec.trainer import Trainer

REFERENCE_BATCH = 256
# Micro-batches per rank per step that a checkpoint may claim where the run's global batch is not on record
# (the built-in trainer's trainer/state.py and hpctrain.task's ElasticLoader judge a checkpoint by it).
MAX_ACCUMULATION = 64


def scaled_lr(trainer_spec: Trainer, global_batch: int) -> float:
    """``trainer.lr`` is for a global batch of 256; the linear rule scales it (Goyal et al., 2017)."""
    if trainer_spec.lr_scaling == "linear":
        return trainer_spec.lr * global_batch / REFERENCE_BATCH
    return trainer_spec.lr


@dataclass(frozen=True)
class BatchLayout:
    """Images per device, per process and per step of the whole job."""

    per_device: int  # trainer.batch_size: per GPU, or per CPU process
    devices_per_process: int  # GPUs one dp task spreads its batch over; 1 for every other strategy
    processes: int  # processes that each load a batch per step: tasks, times the workers of hogwild (pipelines)

    @classmethod
    def of(cls, trainer: Trainer, *, tasks: int, gpus_per_task: int) -> BatchLayout:
        """The layout of ``trainer`` run by ``tasks`` tasks that each see ``gpus_per_task`` GPUs."""
        found = traits(trainer.strategy)
        devices = max(1, gpus_per_task) if found.batch_over_task_gpus else 1
        workers = trainer.hogwild_processes if found.data_processes == "hogwild-workers" else 1
        if found.data_processes == "worker-tasks":  # parameter servers load no data: the batch is over the workers
            tasks = max(1, tasks - trainer.ps.servers)
        processes = tasks * workers
        if found.data_processes == "pipelines":  # the tasks of one pipeline share each batch
            processes = max(1, tasks // trainer.pipeline.stages)
        return cls(per_device=trainer.batch_size, devices_per_process=devices, processes=processes)

    @property
    def per_process(self) -> int:
        """What one process's loader yields per step."""
        return self.per_device * self.devices_per_process

    @property
    def global_batch(self) -> int:
        """Images in one optimizer step over all processes (what the learning rate is scaled by)."""
        return self.per_process * self.processes

    def describe(self) -> str:
        """E.g. ``64 per GPU x 4 GPUs per task x 2 tasks``."""
        if self.devices_per_process > 1:
            parts = [f"{self.per_device} per GPU", f"{self.devices_per_process} GPUs per task"]
        else:
            parts = [f"{self.per_device} per process"]
        return " x ".join([*parts, f"{self.processes} process{'es' if self.processes > 1 else ''}"])


# -- canonical micro-batches: the global batch, whatever the number of ranks -------------------------------------


def micro_batch_positions(step: int, micro_batch: int, *, micro_batches: int, batch_size: int, length: int) -> range:
    """Positions, in an epoch's (padded) global sample order, of micro-batch ``micro_batch`` of ``step``.

    Step ``k`` takes the ``micro_batches * batch_size`` positions from ``k * global``; micro-batch ``j``
    of them is every ``micro_batches``-th from ``j``. With one micro-batch per rank this is exactly
    DistributedSampler's shard of rank ``j`` cut into batches, so runs that never change shape keep
    their order. ``length`` (a multiple of ``micro_batches``) shortens the last step's micro-batches alike.
    """
    start = step * micro_batches * batch_size + micro_batch
    return range(start, min(length, (step + 1) * micro_batches * batch_size), micro_batches)


def micro_batch_problem(micro_batches: int, ranks: int, *, strategy: str) -> str | None:
    """Why a global batch of ``micro_batches`` canonical micro-batches cannot run on ``ranks`` ranks; None if it can.

    An elastic strategy shares them over any number of ranks up to their count (``jobspec/shares.py``).
    """
    if ranks == micro_batches:
        return None
    if strategy not in ELASTIC_STRATEGIES:
        return (
            f"trainer.strategy: {strategy} cannot resume on another shape: the run's global batch is "
            f"{micro_batches} micro-batches over {micro_batches} processes, this job has {ranks}"
        )
    if ranks > micro_batches:
        return (
            f"the run's global batch is {micro_batches} micro-batches of trainer.batch_size, too few for {ranks} "
            f"ranks (each computes at least one; at most {micro_batches} ranks)"
        )
    return None
