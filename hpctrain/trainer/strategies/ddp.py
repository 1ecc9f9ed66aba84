"""``ddp``: DistributedDataParallel, one task per device (``device_ids=None`` on CPU)."""

from __future__ import annotations

import logging

import torch
from torch import nn

from hpctrain.task.parallel import ddp
from hpctrain.trainer.strategies.base import Strategy
from hpctrain.trainer.strategies.collectives import distributed

log = logging.getLogger(__name__)


class DDP(Strategy):
    name = "ddp"

    def wrap(self, module: nn.Module, device: torch.device) -> nn.Module:
        """DDP over the process group (``hpctrain.task.parallel.ddp``: with ``trainer.deterministic`` its first
        gradient-bucket layout is kept, so a resumed run sums as the uninterrupted one); a single task trains
        the plain module."""
        if not distributed():
            log.info("ddp with a single task: training without a DistributedDataParallel wrapper")
            return module
        device_ids = [device.index] if device.type == "cuda" else None
        return ddp(module, device_ids=device_ids)
