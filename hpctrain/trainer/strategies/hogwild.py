"""Hogwild: several CPU processes update one shared-memory model without locks (Recht et al., 2011).

As in pytorch/examples ``mnist_hogwild``: the main process builds the model and
calls ``share_memory()``; each epoch it forks ``trainer.hogwild_processes``
workers. Worker i of N trains on shard i of N of the train set (disjoint
shards) with its own SGD state, writing into the shared parameters. The main
process relays stop requests, logs, evaluates and checkpoints; the workers'
optimizer states and positions come back at the end of every epoch (or stop)
and go into the checkpoint. CPU only; the result is not bit-reproducible.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import os
import queue as queue_module
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.multiprocessing as mp

from hpctrain.errors import TrainingConfigError
from hpctrain.runtime import heartbeat
from hpctrain.runtime.stop import StopReason
from hpctrain.task.rng import seed_everything
from hpctrain.task.samplers import ResumableDistributedSampler
from hpctrain.trainer.data.loaders import build_loaders
from hpctrain.trainer.evaluation import Accuracy, new_sums
from hpctrain.trainer.optim import build_optimizer, build_scheduler
from hpctrain.trainer.precision import Precision
from hpctrain.trainer.state import StepWindow
from hpctrain.trainer.step import TrainStep
from hpctrain.trainer.strategies.base import EpochHost, Strategy, refuse_several_tasks

if TYPE_CHECKING:
    from torch import nn

    from hpctrain.jobspec.models import JobSpec
    from hpctrain.runtime.context import TaskEnv

log = logging.getLogger(__name__)
_POLL_S = 0.2
_JOIN_S = 30.0


@dataclass
class WorkerState:
    """What one worker carries from one epoch (or attempt) to the next."""

    step_in_epoch: int = 0
    optimizer: dict[str, Any] | None = None
    scheduler: dict[str, Any] | None = None
    report: dict[str, Any] = field(default_factory=dict)


class Hogwild(Strategy):
    """Trains the train part of each epoch in ``trainer.hogwild_processes`` forked workers.

    Its checkpoint part (``state_parts``) is every worker's optimizer, schedule and position.
    """

    name = "hogwild"

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.workers = [WorkerState() for _ in range(processes)]
        self.steps: list[int] = []
        self.steps_per_epoch = 0
        self.threads = 1  # torch threads per worker
        self._images_per_s = 0.0  # of the last epoch trained
        self._data_wait_fraction: float | None = None
        self._host: EpochHost | None = None

    @classmethod
    def from_spec(cls, spec: JobSpec) -> Hogwild:
        return cls(spec.trainer.hogwild_processes)

    def check(self, env: TaskEnv, device: torch.device) -> None:
        refuse_several_tasks(self.name, env)
        if device.type == "cuda":
            raise TrainingConfigError(
                "trainer.strategy: hogwild is CPU-only (lock-free updates of one shared-memory model)",
                hint="set resources.gpus_per_node: 0 for hogwild, or use trainer.strategy: ddp on GPUs",
            )
        super().check(env, device)

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        return module.share_memory()

    def epoch_workers(self, host: EpochHost) -> Hogwild:
        """Bind to the trainer's run; each worker trains shard i of ``processes`` of the train set."""
        self._host = host
        cap = host.spec.trainer.max_steps_per_epoch
        self.steps = []
        for index in range(self.processes):
            shard = len(ResumableDistributedSampler(range(host.train_samples), self.processes, index))
            batches = math.ceil(shard / host.layout.per_process)
            self.steps.append(min(batches, cap or batches))
        self.steps_per_epoch = sum(self.steps)
        self.threads = max(1, len(os.sched_getaffinity(0)) // self.processes)
        return self

    def state_parts(self) -> dict[str, Any]:
        return {"hogwild": self}

    @property
    def host(self) -> EpochHost:
        if self._host is None:
            raise RuntimeError("Hogwild.epoch_workers(host) must be called before training")
        return self._host

    def train_epoch(self, epoch: int) -> StopReason | None:
        host = self.host
        host.progress.epoch = epoch
        heartbeat.set_phase("forward_backward")  # the workers train; their reports are this task's steps
        host.before_fork()  # no writer thread may be mid-write while we fork
        context = mp.get_context("fork")
        messages, stop_event = context.Queue(), context.Event()
        base_step = host.progress.global_step - sum(w.step_in_epoch for w in self.workers)
        procs = [
            context.Process(
                target=_worker,
                args=(index, self._worker_args(epoch, index), host.module, messages, stop_event),
                name=f"hogwild-{index}",
            )
            for index in range(self.processes)
        ]
        for proc in procs:
            proc.start()
        try:
            reason = self._supervise(epoch, procs, messages, stop_event, base_step)
        except BaseException:
            for proc in procs:
                proc.terminate()  # a failed epoch's workers may block on a full queue nobody reads any more
            raise
        finally:
            stop_event.set()
            for proc in procs:
                proc.join(_JOIN_S)
                if proc.is_alive():
                    proc.terminate()
        if reason is None:
            self._end_epoch(epoch)
        return reason

    def _supervise(self, epoch: int, procs: list, messages: Any, stop_event: Any, base_step: int) -> StopReason | None:
        host, reason, finished = self.host, None, set()
        window, epoch_window, epoch_started = _Window(), _Window(), time.perf_counter()
        images = 0
        steps_done = [w.step_in_epoch for w in self.workers]
        checked = time.perf_counter()
        while len(finished) < self.processes:
            if time.perf_counter() - checked >= _POLL_S:  # workers hear of a stop within a step of it
                checked = time.perf_counter()
                for index, proc in enumerate(procs):
                    if proc.exitcode not in (None, 0) and index not in finished:
                        raise _worker_failure(index, proc.exitcode, messages)
                if reason is None and (reason := host.stop.agreed()) is not None:
                    stop_event.set()
            try:
                kind, index, payload = messages.get(timeout=_POLL_S)
            except queue_module.Empty:
                continue
            if kind == "error":
                raise RuntimeError(f"hogwild worker {index} failed:\n{payload}")
            if kind == "log":
                window.add(index, payload, steps=payload["step"] - steps_done[index])
                epoch_window.add(index, payload, steps=payload["step"] - steps_done[index])
                images += int(payload["sums"][3])
                steps_done[index] = payload["step"]
                host.progress.global_step = base_step + sum(steps_done)
                heartbeat.step(host.progress.global_step, epoch)  # the workers' steps are this task's progress
                host.reporter.advance(host.progress.global_step)
                if window.steps >= host.spec.trainer.log_every_steps:
                    host.reporter.train_step(
                        epoch=epoch,
                        step=sum(steps_done),
                        global_step=host.progress.global_step,
                        values=window.values(),
                        steps=window.steps,
                    )
                    window = _Window()
            elif kind == "done":
                self._collect(epoch, index, payload)
                steps_done[index] = payload["step_in_epoch"]
                finished.add(index)
        host.progress.step_in_epoch = sum(steps_done)
        host.progress.global_step = base_step + sum(steps_done)
        self._images_per_s = images / max(1e-9, time.perf_counter() - epoch_started)
        self._data_wait_fraction = epoch_window.data_wait_fraction() if epoch_window.steps else None
        if self._data_wait_fraction is not None:
            host.progress.data_wait_fraction = self._data_wait_fraction
        return reason if reason is not None else host.stop.agreed()

    def _collect(self, epoch: int, index: int, payload: dict[str, Any]) -> None:
        worker = self.workers[index]
        worker.step_in_epoch = payload["step_in_epoch"]
        worker.optimizer = torch.load(io.BytesIO(payload["optimizer"]), weights_only=True)
        worker.scheduler = payload["scheduler"]
        worker.report = {k: payload[k] for k in ("steps", "samples", "indices_sha256", "shard")} | {"epoch": epoch}
        self.host.epoch_sums.add(torch.tensor(payload["sums"], dtype=torch.float64))

    def _end_epoch(self, epoch: int) -> None:
        host = self.host
        train = Accuracy.from_sums(host.epoch_sums.sums.cpu())
        host.progress.record_train(train, self._images_per_s, self._data_wait_fraction)
        host.summary["hogwild_workers"] = [dict(w.report, worker=i) for i, w in enumerate(self.workers)]
        for worker in self.workers:
            worker.step_in_epoch = 0  # the next epoch starts every shard from its beginning
        last_lr = (self.workers[0].scheduler or {}).get("_last_lr") or [0.0]
        values = {
            **train.as_dict(),
            "images_per_s": self._images_per_s,
            "data_wait_fraction": self._data_wait_fraction,
            "lr": last_lr[0],
        }
        host.reporter.epoch_end(epoch=epoch, global_step=host.progress.global_step, values=values)

    def _worker_args(self, epoch: int, index: int) -> dict[str, Any]:
        host, worker = self.host, self.workers[index]
        return {
            "spec": host.spec,
            "epoch": epoch,
            "start": worker.step_in_epoch,
            "steps": self.steps[index],
            "processes": self.processes,
            "batch_size": host.layout.per_process,
            "global_batch_size": host.layout.global_batch,
            "threads": self.threads,
            "optimizer": worker.optimizer,
            "scheduler": worker.scheduler,
            "steps_per_epoch": max(self.steps),
        }

    def state_dict(self) -> dict[str, Any]:
        workers = [
            {"step_in_epoch": w.step_in_epoch, "optimizer": w.optimizer, "scheduler": w.scheduler} for w in self.workers
        ]
        return {"processes": self.processes, "workers": workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["processes"] != self.processes:
            log.warning(
                "checkpoint has %d hogwild workers, this run %d: workers start with fresh optimizer state",
                state["processes"],
                self.processes,
            )
            return
        self.workers = [WorkerState(w["step_in_epoch"], w["optimizer"], w["scheduler"]) for w in state["workers"]]


def _worker_failure(index: int, exitcode: int, messages: Any) -> RuntimeError:
    """The error a dead worker reported before it exited (its traceback), else its exit code."""
    try:
        while True:
            kind, sender, payload = messages.get(timeout=1.0)
            if kind == "error":
                return RuntimeError(f"hogwild worker {sender} failed:\n{payload}")
    except queue_module.Empty:
        return RuntimeError(f"hogwild worker {index} died with exit code {exitcode}")


class _Window:
    """The workers' log messages since the last log line, merged."""

    def __init__(self) -> None:
        self.sums = torch.zeros(4, dtype=torch.float64)
        self.steps, self.data_s, self.busy_s, self.lr = 0, 0.0, 0.0, 0.0
        self.rates: dict[int, list[float]] = {}  # worker -> [images, seconds]

    def add(self, index: int, payload: dict[str, Any], *, steps: int) -> None:
        self.sums += torch.tensor(payload["sums"], dtype=torch.float64)
        self.steps += steps
        self.data_s += payload["data_s"]
        self.busy_s += payload["elapsed_s"]
        self.lr = payload["lr"]
        rate = self.rates.setdefault(index, [0.0, 0.0])
        rate[0] += payload["sums"][3]
        rate[1] += payload["elapsed_s"]

    def values(self) -> dict[str, float]:
        correct1, correct5, loss_sum, count = self.sums.tolist()
        count, steps = max(1.0, count), max(1, self.steps)
        return {
            "loss": loss_sum / count,
            "lr": self.lr,
            "top1": 100 * correct1 / count,
            "top5": 100 * correct5 / count,
            "images_per_s": sum(images / seconds for images, seconds in self.rates.values() if seconds > 0),
            "data_s": self.data_s / steps,
            "step_s": self.busy_s / steps,
            "data_wait_fraction": self.data_wait_fraction(),
        }

    def data_wait_fraction(self) -> float:
        """Of the workers' time, summed over workers, the share they spent waiting for their next batch."""
        return min(1.0, self.data_s / self.busy_s) if self.busy_s > 0 else 0.0


def _worker(index: int, args: dict[str, Any], model: torch.nn.Module, messages: Any, stop_event: Any) -> None:
    """One hogwild process: train shard ``index`` of the epoch into the shared ``model``."""
    try:
        messages.put(("done", index, _train_shard(index, args, model, messages, stop_event)))
    except BaseException:
        messages.put(("error", index, traceback.format_exc()))
        raise SystemExit(1) from None  # a normal exit flushes the queue; os._exit would not


def _train_shard(index: int, args: dict[str, Any], model: torch.nn.Module, messages: Any, stop_event: Any) -> dict:
    spec, cfg = args["spec"], args["spec"].trainer
    torch.set_num_threads(args["threads"])
    seed_everything(cfg.seed + 1 + 7919 * (args["epoch"] + 1) + index)
    loaders = build_loaders(
        spec.data,
        cfg,
        rank=index,
        world_size=args["processes"],
        device_is_cuda=False,
        epoch_seed=cfg.seed,
        batch_size=args["batch_size"],
    )
    loaders.set_epoch(args["epoch"])
    loaders.train_sampler.set_start_batch(args["start"], args["batch_size"])
    device = torch.device("cpu")
    precision = Precision(cfg.precision, device)
    optimizer = build_optimizer(model, cfg, args["global_batch_size"])
    scheduler = build_scheduler(optimizer, cfg, args["steps_per_epoch"])
    if args["optimizer"] is not None:
        optimizer.load_state_dict(args["optimizer"])
        scheduler.load_state_dict(args["scheduler"])
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    train_step = TrainStep(
        model, model, optimizer, scheduler, precision, criterion, Strategy(), device, cfg.channels_last
    )
    indices = list(loaders.train_sampler)
    batches = iter(loaders.train_loader)
    epoch_sums, window = new_sums(device), StepWindow()
    model.train()
    step = args["start"]
    while step < args["steps"] and not stop_event.is_set():
        fetch_started = time.perf_counter()
        images, targets = next(batches)
        data_s = time.perf_counter() - fetch_started
        sums = train_step(images, targets)
        epoch_sums += sums
        window.add(sums, data_s=data_s, images=targets.shape[0])
        step += 1
        if step % cfg.log_every_steps == 0 or step == args["steps"]:
            elapsed_s = time.perf_counter() - window.started
            lr = optimizer.param_groups[0]["lr"]
            values = {"step": step, "sums": window.sums.tolist(), "data_s": window.data_s, "lr": lr}
            messages.put(("log", index, {**values, "elapsed_s": elapsed_s}))
            window.reset()
    samples = min(len(indices), (step - args["start"]) * args["batch_size"])
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return {
        "step_in_epoch": step,
        "steps": step - args["start"],
        "samples": samples,
        "shard": [index, args["processes"]],
        "indices_sha256": hashlib.sha256(str(indices[:samples]).encode()).hexdigest(),
        "sums": epoch_sums.tolist(),
        "optimizer": buffer.getvalue(),
        "scheduler": scheduler.state_dict(),
    }
