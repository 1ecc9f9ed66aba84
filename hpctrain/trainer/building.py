"""The trainer's set-up steps, in the order ``Trainer.setup`` calls them: the data, the model, what trains it.

A part of ``Trainer`` (``trainer.py``, whose ``__init__`` sets every attribute
used here), kept apart so that ``trainer.py`` reads as the story: what is
built here is the loaders (with this rank's share of each step after a change
of shape, ``jobspec/shares.py``), the model on its device and memory format,
the optimizer, precision, strategy wrapper, compiled graph and schedule, and
the one ``TrainStep`` (``step.py``).
"""

from __future__ import annotations

import logging

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.batch import BatchLayout
from hpctrain.jobspec.shares import SharePlan, describe_parts
from hpctrain.jobspec.strategy_traits import traits
from hpctrain.task.step_timer import StepClock
from hpctrain.trainer.compiling import compile_model
from hpctrain.trainer.data.loaders import build_loaders
from hpctrain.trainer.forward_timer import ForwardTimer
from hpctrain.trainer.models import build_model, resolve_num_classes
from hpctrain.trainer.optim import build_optimizer, build_scheduler
from hpctrain.trainer.precision import Precision, to_memory_format
from hpctrain.trainer.split_norm import SplitNorm
from hpctrain.trainer.state import (
    SamplerPosition,
)
from hpctrain.trainer.step import TrainStep
from hpctrain.trainer.strategies import EpochHost

log = logging.getLogger("hpctrain.trainer.trainer")  # the trainer's log lines keep their logger's name


class Building:
    """``Trainer``'s set-up steps (mixed into it)."""

    def build_data(self) -> None:
        rank, world = self.strategy.data_shard(self.env)
        self.loaders = build_loaders(
            self.ctx.spec.data,
            self.cfg,
            rank=rank,
            world_size=world,
            device_is_cuda=self.device.type == "cuda",
            epoch_seed=self.cfg.seed,
            batch_size=self.layout.per_process,
            train_shard=self.strategy.train_shard(self.env),
        )
        self.plan: SharePlan | None = None  # how the ranks share each step's micro-batches, once the shape changed
        self.images_scale: float = self.layout.processes  # this rank's images per step -> the whole job's
        sampler = self.loaders.train_sampler
        if sampler is not None and self.micro_batches != self.layout.processes:
            sampler.set_micro_batches(self.micro_batches)  # elastic: run_micro_batches checked
            self.plan = sampler.plan
            mine = sum(part.samples for part in self.plan.parts(sampler.rank))
            self.images_scale = self.micro_batches * self.layout.per_process / mine
            log.info(
                "the run's global batch is %d micro-batches of %d; this rank computes %s per step "
                "(a step takes %.2fx the full shape's)",
                self.micro_batches,
                self.layout.per_process,
                describe_parts(self.plan.parts(sampler.rank)),
                self.plan.step_cost(),
            )
        self.full_epoch_steps = self._loader_steps()
        self.steps_per_epoch = min(self.full_epoch_steps, self.cfg.max_steps_per_epoch or self.full_epoch_steps)
        if self.loaders.train_loader is not None and self.steps_per_epoch == 0:
            raise TrainingConfigError(
                f"data.root: the train set gives no batches for rank {rank} of {world}",
                hint="use a larger dataset, a smaller trainer.batch_size, or fewer tasks",
            )
        if self.loaders.train_sampler is not None:
            self.sampler_position = SamplerPosition(self.loaders.train_sampler, self.progress, self.layout.per_process)

    def build_model(self) -> None:
        num_classes = resolve_num_classes(self.cfg, self.loaders.num_classes)
        model = build_model(self.cfg, num_classes, image_size=self.ctx.spec.data.image_size)
        self.module = to_memory_format(model.to(self.device), self.cfg.channels_last)

    def build_optimization(self) -> None:
        self.precision = Precision(self.cfg.precision, self.device)
        self.optimizer = build_optimizer(self.module, self.cfg, self.global_batch)
        self.module, self.optimizer = self.precision.prepare(self.module, self.optimizer)  # Apex: before wrapping
        self.model = self.strategy.wrap(self.module, self.device)
        # collective on a split plan (its groups); patches BatchNorm before compiling traces it
        self.split_norm = SplitNorm(self.module, self.plan, self.env.global_rank)
        if self.cfg.compile:
            if not traits(self.strategy.name).compiles:  # the spec check refuses these too
                raise TrainingConfigError(
                    f"trainer.compile: torch.compile does not work with trainer.strategy: {self.strategy.name}",
                    hint="set trainer.compile: false, or use trainer.strategy: ddp",
                )
            compile_model(self.model)  # in place: checkpoints keep the plain module's keys
        self.scheduler = build_scheduler(self.optimizer, self.cfg, max(1, self.steps_per_epoch))
        self.clock = StepClock(self.device)  # where each step's time goes (task/step_timer.py)
        step = TrainStep(
            self.model,
            self.module,
            self.optimizer,
            self.scheduler,
            self.precision,
            self.criterion,
            self.strategy,
            self.device,
            self.cfg.channels_last,
            clock=self.clock,
        )
        # hooks inside a compiled graph would break it: no split of the backward and no eviction signal then.
        # With DDP the clock's comm hook splits the backward, and each step's own compute feeds slow-node
        # eviction; without it (single, dp, a strategy's own hook) only the forward is known to be local work.
        if not self.cfg.compile and not self.clock.watch_ddp(self.model):
            self.forward_timer = ForwardTimer(self.module, self.device)
        self.shared_step = step  # gradient accumulation (elastic resume) uses it directly
        self.train_step = self.strategy.train_step(step)
        self.strategy.attach(self.optimizer, self.scheduler, max(1, self.steps_per_epoch))
        if self.loaders.train_dataset is not None:
            self.workers = self.strategy.epoch_workers(self._epoch_host())

    def _loader_steps(self) -> int:
        """Steps the train loader has left in this epoch (each takes this rank's parts of the step)."""
        return self.loaders.train_sampler.steps_len() if self.loaders.train_loader is not None else 0

    def _batch_layout(self) -> BatchLayout:
        """The spec's batch layout over this job's tasks and the GPUs this task sees (dp checks they agree)."""
        gpus_per_task = self.strategy.gpus_per_task(self.device)
        return BatchLayout.of(self.cfg, tasks=self.env.world_size, gpus_per_task=gpus_per_task)

    def _epoch_host(self) -> EpochHost:
        return EpochHost(
            spec=self.ctx.spec,
            module=self.module,
            layout=self.layout,
            train_samples=len(self.loaders.train_dataset),
            progress=self.progress,
            epoch_sums=self.epoch_sums,
            reporter=self.reporter,
            stop=self.ctx.stop,
            before_fork=self.checkpoints.wait,
            summary=self.extra_summary,
        )
