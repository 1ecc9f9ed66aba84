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

import torch
from trainer_harness import job_spec, train

from hpctrain.runtime import heartbeat
from hpctrain.trainer.data import datasets
from hpctrain.trainer.trainer import Trainer

# Added to each forward of the slowed rank: SLOW_FORWARD_PER_FORWARD times that rank's previous forward (its module's
# own, measured), at least SLOW_FORWARD_S. Sized by the rank's own speed as the backward's below: under CI's load every
# step is several times longer and two ranks sharing two busy cores wait for each other in the all-reduce, so a fixed
# 0.6 s came out smaller than that exposed communication once (CI #52 named "comm" the largest loss, not the straggler).
SLOW_FORWARD_S = 0.6
SLOW_FORWARD_PER_FORWARD = 6.0
# Added to each backward of the slowed rank, before its gradient buckets are handed over: SLOW_BACKWARD_PER_FORWARD
# times this step's forward on that rank, at least SLOW_BACKWARD_S. Sized by the rank's own speed, so that it stays
# a node's backward about twice as slow however slow the machine is: a step's own compute is ~3-5 forwards, ~0.15-0.3 s
# on the shared 2-core machine when calm (the floor then: 0.3 s), 0.6-1.9 s at nice 10 beside busy loops and up to
# 4.4 s with other sessions' tests too (a fixed 0.3 s came to 1.42x in CI's rehearsal 17, under eviction's 1.5x).
SLOW_BACKWARD_S = 0.3
SLOW_BACKWARD_PER_FORWARD = 4.0
# Added to each training sample read on every rank: per step (8 reads) SLOW_DATA_PER_FORWARD times the rank's previous
# forward, at least SLOW_SAMPLE_S * 8; well above rank 1's lateness below, which grows with the load the same way.
SLOW_SAMPLE_S = 0.06
SLOW_DATA_PER_FORWARD = 16.0
# Added on top to each sample read on rank 1 only: its batch comes later and rank 0 waits in DDP's buffer broadcast.
# Per step (8 reads) LATE_PER_FORWARD times rank 1's previous forward, at least LATE_SAMPLE_S * 8: the two ranks' own
# compute differs by a few forwards' worth under load (0.3 s of 1.5-1.8 s at nice 10 beside two busy loops; in
# rehearsal 22, beside CI's Slurm legs, by more than 3 forwards in 3 of 5 windows, which named rank 0 the slowest).
LATE_SAMPLE_S = 0.03
LATE_PER_FORWARD = 6.0

TRAINER = {"strategy": "ddp", "arch": "resnet18", "epochs": 1, "max_steps_per_epoch": 12, "log_every_steps": 2}


LAST_FORWARD_S = [0.0]  # this process's last training forward (the plain module's own, which DDP wraps later)
LATE_S: list[float] = []  # this process's late reads, per step (rank 1 of slow_data)


def _timed_forward(module: Any) -> None:
    """Note each training forward's own time in ``LAST_FORWARD_S`` (``module``: the plain model, before DDP wraps
    it; the pre-hooks registered on it before this one are not in that time)."""
    began = [0.0]

    def start(module: Any, args: Any) -> None:
        began[0] = time.perf_counter()

    def end(module: Any, args: Any, output: Any) -> None:
        if torch.is_grad_enabled():
            LAST_FORWARD_S[0] = time.perf_counter() - began[0]

    module.register_forward_pre_hook(start)
    module.register_forward_hook(end)


def _slow_forward(slow_rank: int) -> Any:
    build_model = Trainer.build_model

    def sleep(module: Any, args: Any) -> None:
        time.sleep(max(SLOW_FORWARD_S, SLOW_FORWARD_PER_FORWARD * LAST_FORWARD_S[0]))

    def build(self: Trainer) -> None:
        build_model(self)
        if self.env.global_rank == slow_rank:
            self.module.register_forward_pre_hook(sleep)  # before the clock's start: its own time is not in it
            _timed_forward(self.module)

    return build


def _timed(build_model: Any) -> Any:
    def build(self: Trainer) -> None:
        build_model(self)
        _timed_forward(self.module)

    return build


INJECTED_S: list[float] = []  # this process's sleeps in its backward (or, in the clean run, the would-be ones)


def _slow_backward(slow_rank: int, *, sleeps: bool) -> Any:
    """The backward of the last layer (``fc``, the first the backward meets) sleeps on ``slow_rank``: the
    rest of its backward, and so every gradient bucket, comes later; its forward is untouched. The sleep is
    ``SLOW_BACKWARD_PER_FORWARD`` times the time from the module's forward to that hook (the forward, the loss,
    ``fc``'s own backward), at least ``SLOW_BACKWARD_S``; each one is noted in ``INJECTED_S``. Without
    ``sleeps`` (the clean run) only what it would have slept is noted."""
    build_model = Trainer.build_model
    began = [0.0]

    def forward_began(module: Any, args: Any) -> None:
        if torch.is_grad_enabled():
            began[0] = time.perf_counter()

    def backward_hook(module: Any, grad_in: Any, grad_out: Any) -> None:
        seconds = max(SLOW_BACKWARD_S, SLOW_BACKWARD_PER_FORWARD * (time.perf_counter() - began[0]))
        if sleeps:
            start = time.perf_counter()
            time.sleep(seconds)
            seconds = time.perf_counter() - start
        INJECTED_S.append(seconds)

    def build(self: Trainer) -> None:
        build_model(self)
        if self.env.global_rank == slow_rank:
            self.module.register_forward_pre_hook(forward_began)
            self.module.fc.register_full_backward_hook(backward_hook)

    return build


def scenario_eviction(rank: int, world_size: int, *, data_root: str, base_dir: str, case: str) -> dict[str, Any]:
    """One ddp run of ``case``, "clean" or "slow_backward" (rank 1's backward slowed); with this rank's
    heartbeat as its monitor would write it (``heartbeat``) and its backward's sleeps (``injected_s``; in the
    clean run what rank 1 would have slept at that run's speed; none on rank 0)."""
    Trainer.build_model = _slow_backward(1, sleeps=case == "slow_backward")  # type: ignore[method-assign]
    spec = job_spec(Path(data_root), trainer=TRAINER)
    result = train(Path(base_dir) / case, spec, rank=rank, world_size=world_size)
    return {"result": result, "heartbeat": heartbeat.recorder().snapshot(), "injected_s": INJECTED_S}


def scenario_split(rank: int, world_size: int, *, data_root: str, base_dir: str, case: str) -> dict[str, Any]:
    """One ddp run of ``case``: "clean", "slow_rank" (rank 1's forward slowed) or "slow_data" (every rank's
    reads slowed, rank 1's more); with this rank's heartbeat (its steps' own compute)."""
    if case == "slow_rank":
        Trainer.build_model = _slow_forward(1)  # type: ignore[method-assign]
    elif case == "slow_data":
        read = datasets.TrainImages.__getitem__
        Trainer.build_model = _timed(Trainer.build_model)  # type: ignore[method-assign]
        reads = [0]

        def slow_read(self: Any, index: int) -> Any:
            late = max(LATE_SAMPLE_S * 8, LATE_PER_FORWARD * LAST_FORWARD_S[0]) if rank == 1 else 0.0
            if rank == 1 and reads[0] % 8 == 0:
                LATE_S.append(late)
            reads[0] += 1
            slow = max(SLOW_SAMPLE_S * 8, SLOW_DATA_PER_FORWARD * LAST_FORWARD_S[0])
            time.sleep((slow + late) / 8)
            return read(self, index)

        datasets.TrainImages.__getitem__ = slow_read  # type: ignore[method-assign]
    spec = job_spec(Path(data_root), trainer=TRAINER)
    result = train(Path(base_dir) / case, spec, rank=rank, world_size=world_size)
    return {"result": result, "heartbeat": heartbeat.recorder().snapshot(), "late_s": LATE_S}
