"""Entry point that proves the process group works: every rank adds up rank + 1.

``entrypoint: hpctrain.examples.allreduce_check:main``. Each rank contributes
``rank + 1``; after an all-reduce every rank must hold ``W * (W + 1) / 2``.
A wrong sum raises, so the job fails instead of reporting success.
"""

from __future__ import annotations

import socket
from typing import Any

import torch
import torch.distributed as dist

from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.context import TaskContext


def main(ctx: TaskContext, **kwargs: Any) -> dict[str, Any]:
    world_size = ctx.env.world_size
    value = torch.tensor([float(ctx.env.global_rank + 1)], device=ctx.device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(value)
    total = value.item()
    expected = world_size * (world_size + 1) / 2
    if total != expected:
        raise DistributedSetupError(f"all_reduce over {world_size} ranks gave {total}, expected {expected}")
    return {
        "rank": ctx.env.global_rank,
        "world_size": world_size,
        "sum": total,
        "expected": expected,
        "hostname": socket.gethostname(),
        "device": str(ctx.device),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "args": kwargs,
    }
