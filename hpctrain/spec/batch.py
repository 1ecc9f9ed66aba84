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

if TYPE_CHECKING:
    from hpctrain.spec.models import Trainer

REFERENCE_BATCH = 256


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
        devices = max(1, gpus_per_task) if trainer.strategy == "dp" else 1
        workers = trainer.hogwild_processes if trainer.strategy == "hogwild" else 1
        if trainer.strategy == "ps":  # parameter servers load no data: the global batch is over the workers
            tasks = max(1, tasks - trainer.ps.servers)
        processes = tasks * workers
        if trainer.strategy == "pipeline":  # the tasks of one pipeline share each batch
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
