"""``single``: one task, one device, no process group: the tutorials' non-distributed mode."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hpctrain.trainer.strategies.base import Strategy, refuse_several_tasks

if TYPE_CHECKING:
    from hpctrain.runtime.context import TaskEnv


class Single(Strategy):
    name = "single"

    def check(self, env: TaskEnv, device: torch.device) -> None:
        refuse_several_tasks(self.name, env)
        super().check(env, device)
