"""``model_parallel``: one task spreads consecutive layers over its GPUs (the PyTorch model-parallel
tutorial's two-GPU ResNet, for any number of GPUs and any arch the pipeline can cut).

The parts come from the same splitting code as ``pipeline``. Without ``split_size`` a batch goes
through the GPUs whole, one after the other, and the model computes exactly what ``single`` does.
With ``split_size`` the batch is cut into micro-batches that flow through the parts in a wavefront
(part i works on micro-batch t - i), so the GPUs overlap, as in the tutorial's pipelined version;
BatchNorm then sees one micro-batch at a time. The output goes back to the task's own device, so
the loss, the metrics and the checkpoints (the model's own keys) work as for ``single``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.strategies.base import Strategy, refuse_several_tasks
from hpctrain.trainer.strategies.splitting import choose_starts, describe, parts_of, sequential_blocks

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.jobspec.models import ModelParallel as ModelParallelSpec
    from hpctrain.runtime.context import TaskEnv

log = logging.getLogger(__name__)


def model_parallel_devices(first: torch.device, wanted: int | None) -> list[torch.device]:
    """The task's device first, then the other visible GPUs, ``wanted`` of them (default all)."""
    count = torch.cuda.device_count()
    start = first.index or 0
    order = [start] + [i for i in range(count) if i != start]
    return [torch.device("cuda", i) for i in order[: wanted or count]]


class SplitModel(nn.Module):
    """The parts on their devices; returns the output on ``devices[0]``."""

    def __init__(self, parts: list[nn.Module], devices: list[torch.device], split_size: int | None) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.devices = devices
        self.split_size = split_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.split_size is None or self.split_size >= x.shape[0]:
            for part, device in zip(self.parts, self.devices, strict=True):
                x = part(x.to(device, non_blocking=True))
            return x.to(self.devices[0])
        chunks = list(x.split(self.split_size))
        outs: list[torch.Tensor] = list(chunks)
        stages = len(self.parts)
        for tick in range(len(chunks) + stages - 1):
            for index in reversed(range(stages)):  # later parts first: their inputs were made last tick
                chunk = tick - index
                if 0 <= chunk < len(chunks):
                    device = self.devices[index]
                    outs[chunk] = self.parts[index](outs[chunk].to(device, non_blocking=True))
        return torch.cat(outs).to(self.devices[0])


class ModelParallel(Strategy):
    name = "model_parallel"
    evaluates_wrapped = True  # the plain module is spread over devices; its own forward would not move inputs

    def __init__(self, cfg: ModelParallelSpec, arch: str, batch_size: int, image_size: int) -> None:
        self.cfg, self.arch, self.batch_size, self.image_size = cfg, arch, batch_size, image_size
        self.split: list[str] = []

    @classmethod
    def from_spec(cls, spec: JobSpec) -> ModelParallel:
        return cls(spec.trainer.model_parallel, spec.trainer.arch, spec.trainer.batch_size, spec.data.image_size)

    def check(self, env: TaskEnv, device: torch.device) -> None:
        refuse_several_tasks(self.name, env)
        seen = torch.cuda.device_count() if device.type == "cuda" else 0
        wanted = self.cfg.devices or max(2, seen)
        if seen < 2 or wanted > seen:
            raise TrainingConfigError(
                f"trainer.strategy: model_parallel spreads the layers over {wanted} GPUs, but this task sees "
                f"{seen} (device {device})",
                hint="ask for 2 or more GPUs (resources.gpus_per_node) and one task, lower "
                "trainer.model_parallel.devices, or use trainer.strategy: pipeline on CPUs",
            )
        super().check(env, device)

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        devices = model_parallel_devices(device, self.cfg.devices)
        blocks = sequential_blocks(module, self.arch, self.name)
        sample = None
        if self.cfg.balance == "time" and not self.cfg.split_points:
            micro = self.cfg.split_size or self.batch_size
            sample = torch.randn(micro, 3, self.image_size, self.image_size, device=device)
        starts = choose_starts(
            blocks,
            len(devices),
            balance=self.cfg.balance,
            split_points=self.cfg.split_points,
            key="trainer.model_parallel",
            sample=sample,
        )
        parts = parts_of(blocks, starts)
        for part, target in zip(parts, devices, strict=True):
            part.to(target)
        self.split = describe(blocks, starts)
        log.info("model_parallel parts: %s", "; ".join(f"{d}: {s}" for d, s in zip(devices, self.split, strict=True)))
        return SplitModel(parts, devices, self.cfg.split_size)
