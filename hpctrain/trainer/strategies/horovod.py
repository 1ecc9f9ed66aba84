"""``horovod``: refused by the trainer too (a spec built in Python skips ``validate``); see hpctrain.jobspec.horovod."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.horovod import ALTERNATIVE, horovod_refusal
from hpctrain.trainer.strategies.base import Strategy

if TYPE_CHECKING:
    from hpctrain.runtime.context import TaskEnv


class Horovod(Strategy):
    name = "horovod"

    def check(self, env: TaskEnv, device: torch.device) -> None:
        reason = horovod_refusal().removesuffix(f"; {ALTERNATIVE}")
        raise TrainingConfigError(f"trainer.strategy: horovod: {reason}", hint=ALTERNATIVE)
