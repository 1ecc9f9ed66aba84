"""DistributedDataParallel that resumes bit for bit: :func:`ddp`.

DDP normally rebuilds its gradient buckets after the first iteration, and an
all-reduce sums each element in an order that depends on where it sits in its
bucket (ring algorithms chunk the buffer). A resumed run's first step then uses
the initial layout where the uninterrupted run used the rebuilt one, and with
more than two ranks the weights differ in the last bits (measured: 4 gloo ranks,
ResNet-18 in the trainer, the tiny CNN of ``hpctrain/examples/own_loop.py``).
With deterministic algorithms on, :func:`ddp` keeps the first layout:
``find_unused_parameters=True`` is what disables the rebuild. It costs one
autograd-graph walk per step, and DDP warns once that it found no unused
parameters (expected). The built-in trainer's ``ddp`` strategy wraps with it too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.task.process_group import require_group


def ddp(module: nn.Module, **kwargs: Any) -> nn.Module:
    """``module`` in DistributedDataParallel (the module itself for a single process).

    With several ranks and no process group yet, it is formed first (``task/process_group.py``).

    ``device_ids`` default to the module's GPU; ``find_unused_parameters`` to whether deterministic
    algorithms are on (see the module doc). Other ``kwargs`` go to DistributedDataParallel.
    """
    require_group("hpctrain.task.ddp()")
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return module
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    kwargs.setdefault("device_ids", [device.index] if device.type == "cuda" else None)
    kwargs.setdefault("find_unused_parameters", torch.are_deterministic_algorithms_enabled())
    return nn.parallel.DistributedDataParallel(module, **kwargs)
