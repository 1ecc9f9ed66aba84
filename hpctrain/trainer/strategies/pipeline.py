"""``pipeline``: the model cut into ``trainer.pipeline.stages`` consecutive stages, one task per stage,
run by ``torch.distributed.pipelining`` (GPipe or 1F1B over micro-batches); replicas of the
pipeline train data-parallel when the job has stages x replicas tasks.

Every rank builds the whole torchvision model (same seed, same weights) and trains only its
stage, a ``nn.Sequential`` of the model's own blocks. So the whole model keeps its torchvision
keys: a checkpoint gathers every stage's weights (:func:`sync_whole_model`) and loads into
``strategy: single``. Per-stage optimizer states go in the checkpoint's ``pipeline`` part.
On a GPU the other stages' layers are kept on the CPU, so a GPU holds one stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hpctrain.errors import TrainingConfigError
from hpctrain.runtime import heartbeat
from hpctrain.trainer.batches import batch_to_device
from hpctrain.trainer.evaluation import (
    Accuracy,
    all_reduce_sums,
    batch_sums,
    kept_samples,
    new_sums,
    new_val_sums,
    val_batch_sums,
)
from hpctrain.trainer.strategies.base import Strategy
from hpctrain.trainer.strategies.splitting import choose_starts, describe, parts_of, sequential_blocks
from hpctrain.trainer.strategies.stage_comm import (
    StageGroups,
    StageLayout,
    average_gradients,
    broadcast_tensors,
    make_groups,
    pass_sums_to_first,
    recv_activation,
    send_activation,
    sync_replica_buffers,
    sync_whole_model,
)

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec
    from hpctrain.jobspec.models import Pipeline as PipelineSpec
    from hpctrain.runtime.context import TaskEnv
    from hpctrain.trainer.state import Stateful
    from hpctrain.trainer.step import TrainStep

log = logging.getLogger(__name__)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


class Pipeline(Strategy):
    name = "pipeline"

    def __init__(self, cfg: PipelineSpec, arch: str, batch_size: int, image_size: int) -> None:
        self.cfg, self.arch, self.batch_size, self.image_size = cfg, arch, batch_size, image_size
        self.layout: StageLayout | None = None
        self.split: list[str] = []  # the stages, described, for logs and tests

    @classmethod
    def from_spec(cls, spec: JobSpec) -> Pipeline:
        return cls(spec.trainer.pipeline, spec.trainer.arch, spec.trainer.batch_size, spec.data.image_size)

    def check(self, env: TaskEnv, device: torch.device) -> None:
        stages = self.cfg.stages
        if env.world_size % stages:
            raise TrainingConfigError(
                f"trainer.pipeline.stages: {env.world_size} tasks are not a multiple of {stages} stages",
                hint="start stages x replicas tasks (resources.nodes x tasks_per_node), or change the stages",
            )
        if self.batch_size % self.cfg.microbatches:
            raise TrainingConfigError(
                f"trainer.pipeline.microbatches: {self.cfg.microbatches} does not divide trainer.batch_size "
                f"{self.batch_size}",
                hint="make trainer.batch_size a multiple of trainer.pipeline.microbatches",
            )
        if self.cfg.schedule == "1f1b" and self.cfg.microbatches < stages:
            raise TrainingConfigError(
                f"trainer.pipeline.microbatches: schedule 1f1b needs at least {stages} (one per stage), not "
                f"{self.cfg.microbatches}",
                hint="raise trainer.pipeline.microbatches, or use trainer.pipeline.schedule: gpipe",
            )
        super().check(env, device)
        if not dist.is_initialized():
            raise TrainingConfigError(
                f"trainer.strategy: pipeline needs {stages} tasks in a process group, but this is a single process",
                hint=f"run {stages} (or a multiple) tasks, or use trainer.strategy: single",
            )
        self.layout = StageLayout(stages, env.world_size, env.global_rank)

    def data_shard(self, env: TaskEnv) -> tuple[int, int]:
        """A pipeline's stages read the same batches: stage 0 its images, the last stage its targets."""
        return env.global_rank // self.cfg.stages, env.world_size // self.cfg.stages

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        layout = self._layout()
        blocks = sequential_blocks(module, self.arch, self.name)
        starts = [0] * layout.stages
        if layout.rank == 0:  # one rank chooses (a measured balance differs between ranks), all use it
            sample = None
            if self.cfg.balance == "time" and not self.cfg.split_points:
                micro = self.batch_size // self.cfg.microbatches
                sample = torch.randn(micro, 3, self.image_size, self.image_size, device=device)
            starts = choose_starts(
                blocks,
                layout.stages,
                balance=self.cfg.balance,
                split_points=self.cfg.split_points,
                key="trainer.pipeline",
                sample=sample,
            )
        shared: list[Any] = [starts]
        dist.broadcast_object_list(shared, src=0)
        starts = shared[0]
        self.parts = parts_of(blocks, starts)
        self.split = describe(blocks, starts)
        if layout.rank == 0:
            log.info("pipeline stages: %s", "; ".join(f"{i}: {d}" for i, d in enumerate(self.split)))
        self.device, self.full_model = device, module
        self.stage_module = self.parts[layout.stage]
        if device.type == "cuda":  # this GPU holds one stage; the others' copies wait on the CPU for checkpoints
            for index, part in enumerate(self.parts):
                if index != layout.stage:
                    part.to("cpu")
        self.groups: StageGroups = make_groups(layout)
        if self.groups.replicas is not None:  # replicas start from replica 0's weights, as DDP's do
            tensors = [*self.stage_module.parameters(), *self.stage_module.buffers()]
            broadcast_tensors(tensors, layout.rank_of(layout.stage, replica=0), device, self.groups.replicas)
        self.stage = PipelineStage(self.stage_module, layout.stage, layout.stages, device, group=self.groups.pipeline)
        return self.stage_module

    def train_step(self, step: TrainStep) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        self.optimizer = step.optimizer
        schedule = SCHEDULES[self.cfg.schedule](self.stage, self.cfg.microbatches, loss_fn=step.criterion)
        return PipelineStep(self, step, schedule)

    def evaluate(
        self, model: nn.Module, module: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], **kwargs: Any
    ) -> Accuracy:
        """Forward only, one batch at a time: activations go stage to stage, the last stage scores them."""
        layout, device = self._layout(), kwargs["device"]
        sync_replica_buffers(self.stage_module, layout, self.groups, self.device)
        was_training = self.stage_module.training
        self.stage_module.eval()
        sums = new_val_sums(device)
        try:
            with torch.no_grad():
                for images, targets in batches:
                    heartbeat.beat()  # validation makes progress batch by batch (the hang watchdog)
                    kept = kept_samples(targets)
                    images, targets = batch_to_device(images, targets, device, channels_last=kwargs["channels_last"])
                    x = images if layout.is_first else recv_activation(layout.rank_of(layout.stage - 1), device)
                    with kwargs["precision"].autocast():
                        y = self.stage_module(x)
                    if not layout.is_last:
                        send_activation(y, layout.rank_of(layout.stage + 1))
                        continue
                    sums += val_batch_sums(y.float(), targets, kept, kwargs["criterion"])
        finally:
            self.stage_module.train(was_training)
        return Accuracy.from_sums(all_reduce_sums(sums).cpu())

    def state_parts(self) -> dict[str, Stateful | None]:
        """The whole model under its torchvision keys, and each stage's optimizer (none of the trainer's)."""
        return {"model": WholeModel(self), "optimizer": None, "pipeline": StageOptimizers(self)}

    def _layout(self) -> StageLayout:
        if self.layout is None:
            raise RuntimeError("Pipeline.check must run first")
        return self.layout


class PipelineStep:
    """One optimizer step of this rank's stage: the schedule runs every micro-batch's forward and backward."""

    def __init__(self, strategy: Pipeline, step: TrainStep, schedule: ScheduleGPipe | Schedule1F1B) -> None:
        self.strategy, self.step, self.schedule = strategy, step, schedule

    def __call__(self, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Returns [correct1, correct5, loss*n, n] on the first stage, zeros elsewhere (see pass_sums_to_first)."""
        strategy, step, layout = self.strategy, self.step, self.strategy._layout()
        heartbeat.set_phase("forward_backward")  # the schedule's sends and receives included
        images, targets = batch_to_device(images, targets, step.device, channels_last=step.channels_last)
        sync_replica_buffers(strategy.stage_module, layout, strategy.groups, step.device)
        step.optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        args = (images,) if layout.is_first else ()
        target = targets if layout.is_last else None
        with step.precision.autocast():
            output = self.schedule.step(*args, target=target, losses=losses)
        average_gradients(strategy.stage_module, strategy.groups.replicas)
        step.precision.step(step.optimizer)
        step.scheduler.step()
        sums = new_sums(step.device)
        if layout.is_last:
            loss = torch.stack([loss.detach().float() for loss in losses]).mean()
            sums = batch_sums(output.float(), targets, loss)
        return pass_sums_to_first(sums, layout)


class WholeModel:
    """The ``model`` checkpoint part: every stage's weights, under the torchvision model's keys."""

    def __init__(self, strategy: Pipeline) -> None:
        self.strategy = strategy

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: every rank's copy of the whole model is brought up to date first."""
        strategy = self.strategy
        sync_whole_model(strategy.parts, strategy._layout(), strategy.device)
        return strategy.full_model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.strategy.full_model.load_state_dict(state)


class StageOptimizers:
    """The ``pipeline`` checkpoint part: a list of every stage's optimizer state (replica 0's), gathered on rank 0."""

    def __init__(self, strategy: Pipeline) -> None:
        self.strategy = strategy

    def state_dict(self) -> list[dict[str, Any]] | None:
        layout, groups = self.strategy._layout(), self.strategy.groups
        if layout.replica != 0:
            return None
        state = _to_cpu(self.strategy.optimizer.state_dict())
        gathered: list[Any] | None = [None] * layout.stages if layout.rank == 0 else None
        dist.gather_object(state, gathered, dst=0, group=groups.first_pipeline)
        return gathered

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        layout = self.strategy._layout()
        if len(states) != layout.stages:
            log.warning(
                "the checkpoint holds optimizer states for %d stages, this run has %d: optimizer state starts fresh",
                len(states),
                layout.stages,
            )
            return
        self.strategy.optimizer.load_state_dict(states[layout.stage])


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value
