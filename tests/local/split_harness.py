"""Scenarios for the step-split tests: two gloo ranks train ddp clean, with one rank slowed, with a slow loader;
and for slow-node eviction, with rank 1 slowed in its backward only.

The injected causes are sleeps patched into this rank's process only (a forward pre-hook on rank 1's
module, or a backward hook on its last layer; the train dataset's ``__getitem__`` on every rank, longer
on rank 1), so the trainer itself runs unchanged.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trainer_harness import job_spec, train

from hpctrain.runtime import heartbeat
from hpctrain.trainer.data import datasets
from hpctrain.trainer.trainer import Trainer

SLOW_FORWARD_S = 0.6  # added to each forward of the slowed rank (far above what CI's load makes two ranks differ)
SLOW_BACKWARD_S = 0.3  # added to each backward of the slowed rank, before its gradient buckets are handed over
SLOW_SAMPLE_S = 0.06  # added to each training sample read (8 per step)
LATE_SAMPLE_S = 0.03  # added on top on rank 1 only: its batch comes later, rank 0 waits in DDP's buffer broadcast

TRAINER = {"strategy": "ddp", "arch": "resnet18", "epochs": 1, "max_steps_per_epoch": 12, "log_every_steps": 2}


def _slow_forward(slow_rank: int) -> Any:
    build_model = Trainer.build_model

    def build(self: Trainer) -> None:
        build_model(self)
        if self.env.global_rank == slow_rank:
            self.module.register_forward_pre_hook(lambda module, args: time.sleep(SLOW_FORWARD_S))

    return build


def _slow_backward(slow_rank: int) -> Any:
    """The backward of the last layer (``fc``, the first the backward meets) sleeps on ``slow_rank``: the
    rest of its backward, and so every gradient bucket, comes later; its forward is untouched."""
    build_model = Trainer.build_model

    def build(self: Trainer) -> None:
        build_model(self)
        if self.env.global_rank == slow_rank:
            self.module.fc.register_full_backward_hook(lambda module, grad_in, grad_out: time.sleep(SLOW_BACKWARD_S))

    return build


def scenario_eviction(rank: int, world_size: int, *, data_root: str, base_dir: str, case: str) -> dict[str, Any]:
    """One ddp run of ``case``, "clean" or "slow_backward" (rank 1's backward slowed); with this rank's
    heartbeat as its monitor would write it (``heartbeat``)."""
    if case == "slow_backward":
        Trainer.build_model = _slow_backward(1)  # type: ignore[method-assign]
    spec = job_spec(Path(data_root), trainer=TRAINER)
    result = train(Path(base_dir) / case, spec, rank=rank, world_size=world_size)
    return {"result": result, "heartbeat": heartbeat.recorder().snapshot()}


def scenario_split(rank: int, world_size: int, *, data_root: str, base_dir: str, case: str) -> dict[str, Any]:
    """One ddp run of ``case``: "clean", "slow_rank" (rank 1's forward slowed) or "slow_data" (every rank's
    reads slowed, rank 1's more); with this rank's heartbeat (its steps' own compute)."""
    if case == "slow_rank":
        Trainer.build_model = _slow_forward(1)  # type: ignore[method-assign]
    elif case == "slow_data":
        read = datasets.TrainImages.__getitem__

        delay = SLOW_SAMPLE_S + (LATE_SAMPLE_S if rank == 1 else 0.0)

        def slow_read(self: Any, index: int) -> Any:
            time.sleep(delay)
            return read(self, index)

        datasets.TrainImages.__getitem__ = slow_read  # type: ignore[method-assign]
    spec = job_spec(Path(data_root), trainer=TRAINER)
    result = train(Path(base_dir) / case, spec, rank=rank, world_size=world_size)
    return {"result": result, "heartbeat": heartbeat.recorder().snapshot()}
