"""Entry points that the end-to-end tests name in job specs (``entrypoint: MODULE:FUNCTION``).

The launcher imports them by name on the compute nodes, so they live in a
module, not in a test file: ``tests.slurm.entrypoints`` resolves there because
``slurm_cluster.env`` puts the checkout on PYTHONPATH and sbatch exports it.
"""

from __future__ import annotations

import time
from typing import Any

ENTRYPOINT_MODULE = "tests.slurm.entrypoints"


def fail_on_rank(ctx: Any, rank: int, hang_s: float = 600.0) -> dict[str, Any]:
    """Rank ``rank`` raises once the group is up; every other rank hangs for ``hang_s``.

    The survivors sit in a plain sleep, not in a collective that would time
    out by itself: only Slurm ending the step (``srun --kill-on-bad-exit``)
    can end them quickly, which is what the test proves.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()  # every rank got this far: the failure is not a start-up failure
    if ctx.env.global_rank == rank:
        raise RuntimeError(f"deliberate failure on rank {rank}")
    time.sleep(hang_s)
    return {"rank": ctx.env.global_rank, "survived": True}


def hang_on_rank(
    ctx: Any, rank: int, steps: int = 3, compute_s: float = 0.3, hang_s: float = 900.0, freeze: bool = False
) -> dict[str, Any]:
    """``steps`` steps of compute + all-reduce on every rank; then rank ``rank`` gets stuck before the next
    all-reduce while the others wait in it (the hang watchdog's test case). ``freeze``: the rank stops its
    whole process with SIGSTOP instead (heartbeat thread included), as a frozen process or a dead node would.

    Every step's compute takes ``compute_s`` so that the waiting ranks enter the collective measurably
    later than the stuck rank entered its compute.
    """
    import torch
    import torch.distributed as dist

    from hpctrain.runtime import heartbeat

    value = torch.ones(1)
    for number in range(1, steps + 2):
        with heartbeat.phase("forward_backward"):
            time.sleep(compute_s)
            if number == steps + 1 and ctx.env.global_rank == rank:
                if freeze:
                    import os
                    import signal

                    os.kill(os.getpid(), signal.SIGSTOP)
                _stuck_before_collective(hang_s)
        with heartbeat.phase("allreduce"):
            dist.all_reduce(value)
        heartbeat.step(number)
    return {"rank": ctx.env.global_rank, "hung": False}


def _stuck_before_collective(seconds: float) -> None:
    """Named so that the stack dump shows where the rank is stuck."""
    time.sleep(seconds)


def rank_layout(ctx: Any) -> dict[str, Any]:
    """Where this rank runs and how it was started, after one all-reduce proves the group works."""
    import os
    import socket

    import torch
    import torch.distributed as dist

    total = torch.tensor([1.0])
    dist.all_reduce(total)
    env = ctx.env
    return {
        "global_rank": env.global_rank,
        "local_rank": env.local_rank,
        "world_size": env.world_size,
        "node": env.hostname,
        "host": socket.gethostname(),
        "source": env.source,
        "slurm_job_id": env.slurm_job_id,
        "torchrun_rank": os.environ.get("RANK"),
        "ranks_seen": int(total.item()),
    }


def kill_rank(ctx: Any, rank: int, hang_s: float = 600.0) -> dict[str, Any]:
    """Rank ``rank`` kills itself (SIGKILL, as the OOM killer would) once the group is up, on every start."""
    import os
    import signal

    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    if ctx.env.global_rank == rank:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(hang_s)
    return {"rank": ctx.env.global_rank}
