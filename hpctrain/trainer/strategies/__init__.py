"""How one model is spread over devices and tasks: one module per ``trainer.strategy``.

Each strategy implements :class:`~hpctrain.trainer.strategies.base.Strategy`
(refuse bad layouts, wrap the model, its share of the train step, its own
checkpoint state). Checkpoints and evaluation use the plain module.
"""

from __future__ import annotations

import torch

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.strategy_traits import traits
from hpctrain.runtime.context import TaskEnv
from hpctrain.trainer.strategies.base import EpochHost, EpochWorkers, Strategy
from hpctrain.trainer.strategies.ddp import DDP
from hpctrain.trainer.strategies.dp import DataParallel
from hpctrain.trainer.strategies.hogwild import Hogwild
from hpctrain.trainer.strategies.horovod import Horovod
from hpctrain.trainer.strategies.model_parallel import ModelParallel
from hpctrain.trainer.strategies.pipeline import Pipeline
from hpctrain.trainer.strategies.ps import ParameterServer
from hpctrain.trainer.strategies.single import Single

__all__ = ["EpochHost", "EpochWorkers", "Strategy", "build_strategy", "check_strategy"]


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (Single, DataParallel, DDP, Hogwild, ParameterServer, Pipeline, ModelParallel, Horovod)
}


def build_strategy(spec: JobSpec) -> Strategy:
    """The strategy ``trainer.strategy`` names, configured from the spec."""
    if spec.trainer.dp_parallel_loss and not traits(spec.trainer.strategy).parallel_loss:  # the spec check too
        raise TrainingConfigError(
            f"trainer.dp_parallel_loss: only dp computes the loss per GPU, not {spec.trainer.strategy}",
            hint="set trainer.strategy: dp, or remove trainer.dp_parallel_loss",
        )
    return STRATEGIES[spec.trainer.strategy].from_spec(spec)


def check_strategy(name: str, env: TaskEnv, device: torch.device) -> None:
    """Refuse a layout ``name`` (with default settings) cannot run as asked, naming the setting to change."""
    build_strategy(JobSpec.model_validate({"name": "check", "trainer": {"strategy": name}})).check(env, device)
