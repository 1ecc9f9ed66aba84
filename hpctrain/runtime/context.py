"""What one task knows about itself once the runtime has set it up.

``TaskEnv`` is pure data derived from environment variables (see
``hpctrain.runtime.task_env``). ``TaskContext`` adds what the runtime decided
for this task (device, run directory, stop requests) and is what the trainer
and user entry points receive.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hpctrain.contract.rundir import checkpoints_dir

if TYPE_CHECKING:  # torch stays out of login-node imports
    import torch

    from hpctrain.jobspec.models import JobSpec
    from hpctrain.runtime.stop import StopRequest

EnvSource = Literal["slurm", "slurm-torchrun", "submitit-local", "torchrun", "single"]
# Sources whose job is a Slurm job hpctrain submitted: it may requeue itself.
SLURM_SOURCES = ("slurm", "slurm-torchrun")


@dataclass(frozen=True)
class TaskEnv:
    """Rank layout of one task, the same on every rank without talking."""

    global_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    hostnames: tuple[str, ...]
    master_addr: str
    master_port: int
    job_id: str
    restart_count: int
    source: EnvSource
    # Every id a user may know this job by (``hpctrain cancel`` names one in its
    # marker): SLURM_JOB_ID, the array's id, ``<array>_<task>``; a local run's controller
    # PID. Empty for a single process.
    job_aliases: tuple[str, ...] = ()
    # This task's Slurm node, where ``hostnames[node_rank]`` may not be it:
    # torchrun's rendezvous numbers nodes in its own order ("" = that entry).
    node_name: str = ""

    @property
    def is_main(self) -> bool:
        return self.global_rank == 0

    @property
    def slurm_job_id(self) -> str:
        """The id ``scontrol``/``scancel`` understand for *this* job ('' outside Slurm).

        ``<array>_<task>`` for an array task: its own SLURM_JOB_ID would do too,
        except for the last task, whose SLURM_JOB_ID is the array's id -- and
        that id names the whole array.
        """
        return self.job_id if self.under_slurm else ""

    @property
    def under_slurm(self) -> bool:
        """Whether this task runs in a Slurm job hpctrain submitted (srun or torchrun launcher)."""
        return self.source in SLURM_SOURCES

    @property
    def hostname(self) -> str:
        if self.node_name:
            return self.node_name
        return self.hostnames[self.node_rank] if self.hostnames else "localhost"

    def torchrun_env(self) -> dict[str, str]:
        """The variables torchrun-style user code reads."""
        return {
            "RANK": str(self.global_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


@dataclass
class TaskContext:
    """Everything a trainer or entry point needs from the runtime."""

    env: TaskEnv
    spec: JobSpec
    run_dir: Path
    device: torch.device
    stop: StopRequest

    @property
    def is_main(self) -> bool:
        return self.env.is_main

    @property
    def checkpoint_dir(self) -> Path:
        return checkpoints_dir(self.run_dir)


# The context of the entry point this process runs (set by the launcher before it calls the user's function),
# so that ``hpctrain.task`` finds it without the function passing ``ctx`` around.
_registered: TaskContext | None = None


def register_context(ctx: TaskContext | None) -> None:
    """Make ``ctx`` this process's task context (None: forget it)."""
    global _registered
    _registered = ctx


def registered_context() -> TaskContext | None:
    """The task context the launcher registered in this process, if any."""
    return _registered


def configure_logging(env: TaskEnv) -> None:
    """Send hpctrain's own log records (resumes, checkpoint warnings) to the task's
    stderr log, tagged with the rank; other libraries' logging is left alone."""
    logger = logging.getLogger("hpctrain")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"hpctrain rank {env.global_rank} %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
