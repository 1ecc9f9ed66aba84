"""The built-in ImageNet trainer: ``run_training(ctx)`` runs on every task of a job.

``Trainer.fit`` reads top to bottom in the nanoGPT/torchtitan order: seed and
determinism, data, model, strategy, optimizer/precision, resume, then epochs
of train -> validate -> checkpoint -> summary. What it fixes over the
references on shared clusters:

* stop requests (time limit, preemption, cancel) are honoured only at step
  boundaries, agreed by all ranks, followed by a complete checkpoint;
* a mid-epoch resume is exact: the sampler skips the consumed batches, every
  rank gets its RNG state back, so a deterministic run that was interrupted
  ends with the same weights as one that was not; on another number of ranks
  (ddp, any number up to the first start's) it keeps the global batch in
  canonical micro-batches (elastic.py, jobspec/shares.py, split_norm.py);
* validation is exact over the whole val set on any number of ranks;
* checkpoints are atomic and written in the background by rank 0.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.jobspec.node_loss import RUN_MICRO_BATCHES_VAR
from hpctrain.jobspec.shares import Part
from hpctrain.runtime import heartbeat
from hpctrain.runtime.context import TaskContext
from hpctrain.runtime.stop import StopReason
from hpctrain.task.rng import deterministic_mode, seed_everything
from hpctrain.task.weights import weights_sha256
from hpctrain.trainer.building import Building
from hpctrain.trainer.checkpoint import CheckpointManager
from hpctrain.trainer.checkpointing import Checkpointing
from hpctrain.trainer.compiling import compile_failure
from hpctrain.trainer.evaluation import Accuracy
from hpctrain.trainer.reporting import Reporter, run_facts
from hpctrain.trainer.state import (
    EpochSums,
    Progress,
    RngStates,
    SamplerPosition,
    StepWindow,
)
from hpctrain.trainer.strategies import EpochWorkers, build_strategy
from hpctrain.trainer.strategies.collectives import distributed

log = logging.getLogger(__name__)


def run_training(ctx: TaskContext) -> dict[str, Any]:
    """What the launcher calls on every task; returns this rank's summary (JSON-able)."""
    return Trainer(ctx).fit()


class Trainer(Building, Checkpointing):
    """One task's share of a training run.

    The story is here; its set-up steps (``build_data``, ``build_model``, ``build_optimization``) are
    ``building.py``'s, choosing, restoring and saving checkpoints (``load_checkpoint``, ``resume``,
    ``save_checkpoint``) ``checkpointing.py``'s.

    ``on_step(trainer)`` runs after every optimizer step of this process (tests use it to raise stop
    requests at a chosen step); hogwild's steps run in worker processes and do not call it.
    """

    def __init__(self, ctx: TaskContext, *, on_step: Callable[[Trainer], None] | None = None) -> None:
        self.ctx = ctx
        self.cfg = ctx.spec.trainer
        self.env = ctx.env
        self.device = ctx.device
        self.on_step = on_step
        self.progress = Progress()
        self.strategy = build_strategy(ctx.spec)
        self.layout = self._batch_layout()  # per device, per process (what a loader yields), global
        # per step; a resume keeps its checkpoint's (elastic.py), a step on fewer nodes the run's (launcher.py)
        self.micro_batches = int(os.environ.get(RUN_MICRO_BATCHES_VAR) or self.layout.processes)
        self.reporter = Reporter(ctx.run_dir, enabled=ctx.is_main, static=run_facts(ctx, self.global_batch))
        cp = ctx.spec.checkpoint
        self.checkpoints = CheckpointManager(ctx.checkpoint_dir, cp.keep_last, cp.keep_best, cp.async_save)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=self.cfg.label_smoothing)
        self.resumed_from: Path | None = None  # the checkpoint this attempt continues
        self.epoch_sums = EpochSums(self.device, is_main=ctx.is_main)  # this rank's train sums of the epoch
        self.rng = RngStates(self.device, rank=self.env.global_rank, world_size=self.env.world_size)
        self.extra_summary: dict[str, Any] = {}
        self.workers: EpochWorkers | None = None  # set when the strategy trains epochs in other processes
        self.sampler_position: SamplerPosition | None = None
        self._checkpoint: dict[str, Any] | None = None  # loaded in setup, restored (and dropped) by resume
        self._saved_step: int | None = None  # the global step of the newest checkpoint, saved or loaded
        self._start_step = 0  # the global step this start began training at (after its resume)
        self._partial_epoch = False  # the next epoch continues a checkpoint's partial epoch
        self._step_parts: Iterator[list[Part]] | None = None  # this rank's parts of each step (a changed shape)
        self._failed = False

    def fit(self) -> dict[str, Any]:
        with deterministic_mode(self.cfg.deterministic):
            try:
                self.setup()
                return self.evaluate_only() if self.cfg.evaluate_only else self.train()
            except BaseException as exc:
                self._failed = True
                compile_error = compile_failure(exc) if self.cfg.compile else None
                self._report_failure(compile_error or exc)
                if compile_error is not None:
                    raise compile_error from exc
                raise
            finally:
                self._close()

    # -- setup, in order ---------------------------------------------------------------------------------------
    def setup(self) -> None:
        self.strategy.check(self.env, self.device)
        seed_everything(self.cfg.seed)
        self._checkpoint = self.load_checkpoint()  # before the data: the run's global batch is the checkpoint's
        self.build_data()
        self.build_model()
        self.build_optimization()
        torch.manual_seed(self.cfg.seed + 1 + self.env.global_rank)  # per-rank dropout etc. (a resume overrides)
        self.resume()

    @property
    def global_batch(self) -> int:
        """Images per optimizer step, whatever the number of ranks: what the learning rate follows."""
        return self.micro_batches * self.layout.per_process

    # -- the story -------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        self.reporter.start(
            epochs=self.cfg.epochs,
            steps_per_epoch=self._reported_steps_per_epoch(),
            global_step=self.progress.global_step,
            resumed=self.resumed_from is not None,
        )
        self._reserve_checkpoint_buffers()
        self.write_summary("running")
        self._start_step = self.progress.global_step
        for epoch in range(self.progress.epoch, self.cfg.epochs):
            reason = self.train_epoch(epoch)
            if reason is not None:
                return self.stop(reason)
            val = self.validate(epoch)
            self.end_epoch(epoch, val)
            if self.cfg.desired_acc is not None and val.top1 >= self.cfg.desired_acc:
                self.reporter.message(f"val top1 {val.top1:.2f} reached desired_acc {self.cfg.desired_acc}: stopping")
                return self.finish(reason="desired_acc")
        return self.finish()

    def train_epoch(self, epoch: int) -> StopReason | None:
        """Train one epoch (or what is left of it); a stop reason if the ranks agreed to stop."""
        if self.workers is not None:
            return self.workers.train_epoch(epoch)
        self.loaders.set_epoch(epoch)
        if not self._partial_epoch:
            self.loaders.train_sampler.set_start_batch(0, self.layout.per_process)
        self._partial_epoch = False
        start = min(self.steps_per_epoch, self.full_epoch_steps - self._loader_steps())
        self.progress.epoch, self.progress.step_in_epoch = epoch, start
        self.sampler_position.iter_start = start
        self.model.train()
        window, epoch_timer = StepWindow(), StepWindow()
        loads = start < self.steps_per_epoch and self.strategy.loads_data
        with torch.random.fork_rng(devices=[]):  # starting an iterator must not draw from the global RNG
            batches = iter(self.loaders.train_loader) if loads else iter(())
        self._step_parts = self.loaders.train_sampler.step_parts() if self.plan is not None else None
        self.clock.restart()
        for step in range(start, self.steps_per_epoch):
            self.clock.lap("other")
            reason = self.ctx.stop.agreed()
            self.clock.lap("sync")  # a collective: waits for the slowest rank
            if reason is not None:
                return reason
            heartbeat.set_phase("data")
            sums, data_s, images = self._one_step(batches)  # phases forward_backward, allreduce (dp), optimizer
            self.clock.step_done()
            window.add(sums, data_s=data_s, images=images)
            epoch_timer.add(None, data_s=data_s, images=images)
            self.progress.step_in_epoch, self.progress.global_step = step + 1, self.progress.global_step + 1
            heartbeat.step(self.progress.global_step, epoch)
            self._after_step(epoch, step, window, epoch_timer)
        reason = self.ctx.stop.agreed()
        if reason is not None:
            return reason
        self._end_epoch_train_metrics(epoch, epoch_timer)
        return None

    def validate(self, epoch: int) -> Accuracy:
        heartbeat.set_phase("validation")  # evaluate() beats once per batch
        self.strategy.sync_model(self.module)
        val = self.strategy.evaluate(  # every rank evaluates (and saves) rank 0's model
            self.model,
            self.module,
            self.loaders.val_loader,
            device=self.device,
            precision=self.precision,
            criterion=self.criterion,
            channels_last=self.cfg.channels_last,
        )
        self.progress.record_val(val)
        self.reporter.validation(
            epoch=epoch,
            global_step=self.progress.global_step,
            values=val.as_dict(),
            best_top1=self.progress.best_val_top1,
        )
        return val

    def end_epoch(self, epoch: int, val: Accuracy) -> None:
        self.progress.epochs_completed = epoch + 1
        self.progress.epoch, self.progress.step_in_epoch = epoch + 1, 0
        self.epoch_sums.zero()
        if (epoch + 1) % self.ctx.spec.checkpoint.every_epochs == 0:
            self.save_checkpoint(tag="epoch", metric=val.top1)
        self.write_summary("running")

    def stop(self, reason: StopReason) -> dict[str, Any]:
        """Stopped at a step boundary: make sure a checkpoint of exactly this step is on disk, then report.

        A stop before this start trained a step (it came during set-up) saves nothing new.
        """
        trained = self.progress.global_step != self._start_step
        if trained and self._saved_step != self.progress.global_step:
            self.save_checkpoint(tag="stop")
        self.checkpoints.wait()
        self._barrier()
        where = f"at epoch {self.progress.epoch + 1} step {self.progress.step_in_epoch}"
        said = "checkpoint saved" if trained else "before training: nothing new to save"
        self.reporter.message(f"stopping ({reason}) {where}; {said}")
        return self.write_summary("stopped", stop_reason=reason, final=True)

    def finish(self, reason: str | None = None) -> dict[str, Any]:
        if self._saved_step != self.progress.global_step:
            self.save_checkpoint(tag="final", metric=self.progress.val_top1)
        self.checkpoints.wait()
        self._barrier()
        return self.write_summary("completed", stop_reason=reason, final=True)

    def evaluate_only(self) -> dict[str, Any]:
        self.reporter.start(
            epochs=max(1, self.progress.epochs_completed),
            steps_per_epoch=1,
            global_step=self.progress.global_step,
            resumed=False,
        )
        self.validate(max(0, self.progress.epochs_completed - 1))
        return self.write_summary("completed", final=True)

    # -- summaries -------------------------------------------------------------------------------------------------

    def write_summary(self, status: str, *, stop_reason: str | None = None, final: bool = False) -> dict[str, Any]:
        """summary.json on rank 0; every rank gets the dict. ``final`` adds the weights digest on all ranks."""
        fields = {**self._progress_fields(), **self.extra_summary, "stop_reason": stop_reason}
        fields["skipped_samples"] = self.loaders.skipped_samples() if hasattr(self, "loaders") else 0
        if final or self.ctx.is_main:
            fields["weights_sha256"] = weights_sha256(self.module.state_dict())
        return self.reporter.summary(status, fields)

    def _progress_fields(self) -> dict[str, Any]:
        fields = {k: v for k, v in asdict(self.progress).items() if k not in ("epoch", "step_in_epoch")}
        # A start continues the run when it resumed a checkpoint, or the last start stopped (maybe before it
        # trained, saving nothing); under Slurm SLURM_RESTART_COUNT counts every requeue.
        continues = self.resumed_from is not None or self.reporter.prior_status == "stopped"
        resumes = self.reporter.prior_restarts + (1 if continues else 0)
        return {**fields, "restarts": max(self.env.restart_count, resumes), "global_rank": self.env.global_rank}

    # -- small steps -------------------------------------------------------------------------------------------
    def _one_step(self, batches: Any) -> tuple[torch.Tensor, float, int]:
        """Train on the next batch (or, on a ps server, serve the step): the sums to log, data wait, images."""
        if not self.strategy.loads_data:
            sums = self.strategy.serve_step()  # worker 0's batch, for the log lines
            self.clock.lap("unsplit")
            return sums, 0.0, int(sums[-1].item())
        fetch_started = time.perf_counter()
        if self._step_parts is None:  # every run that never changed shape: one micro-batch per rank
            images, targets = next(batches)
            data_s = time.perf_counter() - fetch_started
            self.clock.lap("data")
            sums = self.train_step(images, targets)
            self.clock.lap("unsplit")  # ~0 after TrainStep's own laps; a pipeline's or ps's whole step
            self.strategy.after_step(sums)
            self.epoch_sums.add(sums)
            return sums, data_s, targets.shape[0]
        parts = next(self._step_parts)
        micro = [next(batches) for _ in parts]
        data_s = time.perf_counter() - fetch_started
        self.clock.lap("data")
        sums = self.shared_step.accumulate(
            micro,
            divisors=[self.plan.loss_divisor(part) for part in parts],
            contexts=[self.split_norm.part(part) for part in parts],
        )
        self.clock.lap("unsplit")
        self.strategy.after_step(sums)
        self.epoch_sums.add(sums)
        return sums, data_s, sum(targets.shape[0] for _, targets in micro)

    def _after_step(self, epoch: int, step: int, window: StepWindow, epoch_timer: StepWindow) -> None:
        self.reporter.advance(self.progress.global_step)
        if self.on_step is not None:
            self.on_step(self)
        last = step + 1 == self.steps_per_epoch
        if (step + 1) % self.cfg.log_every_steps == 0 or last:
            values = window.values(world_size=self.images_scale, lr=self.optimizer.param_groups[0]["lr"])
            self.clock.lap("other")
            split = self.clock.window(global_step=self.progress.global_step, epoch=epoch)  # collective
            steps = window.steps
            # Every rank's next windows start here, as the gather ends: rank 0's writes below are in its next
            # window as ``log``, which the others wait for in their next collective (a window that began after
            # them would be shorter than the others' by their length; CI's load made that 23 %). The split
            # counts the longest rank's ``log`` as every rank's (contract/step_split.py), not as communication.
            window.reset()
            self.clock.restart()
            self.reporter.train_step(
                epoch=epoch, step=step + 1, global_step=self.progress.global_step, values=values, steps=steps
            )
            if split is not None:
                self.reporter.step_split(split)
            self.clock.lap("log")
            self.progress.data_wait_fraction = epoch_timer.data_wait_fraction()  # the epoch's so far, for summaries
        every = self.ctx.spec.checkpoint.every_steps
        epoch_save_follows = last and (epoch + 1) % self.ctx.spec.checkpoint.every_epochs == 0
        if every and self.progress.global_step % every == 0 and not epoch_save_follows:
            self.clock.lap("other")
            self.save_checkpoint(tag="step")
            self.clock.lap("checkpoint")

    def _end_epoch_train_metrics(self, epoch: int, timer: StepWindow) -> None:
        train = Accuracy.from_sums(self.epoch_sums.total())
        images_per_s = timer.images_per_s(self.images_scale) if timer.images else self.progress.train_images_per_s
        data_wait = timer.data_wait_fraction() if timer.steps else self.progress.data_wait_fraction
        self.progress.record_train(train, images_per_s, data_wait)
        values = {
            **train.as_dict(),
            "images_per_s": images_per_s,
            "data_wait_fraction": data_wait,
            "lr": self.optimizer.param_groups[0]["lr"],
        }
        self.reporter.epoch_end(epoch=epoch, global_step=self.progress.global_step, values=values)

    def _reported_steps_per_epoch(self) -> int:
        return self.workers.steps_per_epoch if self.workers is not None else self.steps_per_epoch

    def _barrier(self) -> None:
        if distributed():
            dist.barrier()

    def _report_failure(self, exc: BaseException) -> None:
        if self.ctx.is_main:
            self.reporter.failed(exc, {**self._progress_fields(), "failed_node": self.env.hostname})

    def _close(self) -> None:
        try:
            self.checkpoints.close()
        except Exception as exc:
            log.error("%s", exc)
        finally:
            self.strategy.close(failed=self._failed)
            self.reporter.close()
