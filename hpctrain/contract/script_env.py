"""The environment hpctrain gives a user's own code: the names both sides agree on, and where a script
job's program is (:class:`ScriptCode`: ``launch/script_code.py`` finds it at submit, the task's wrapper
runs it). Torch-free.

A ``script:`` job's processes (issue 27) and ``hpctrain.task`` (the public task
API, issue 28) meet here: the script's wrapper on the node sets these variables,
and ``hpctrain.task`` reads them, so a plain script learns its run, its
checkpoints, its restart and how it will be asked to stop without importing
anything of the runtime. Per rank the script also sees the torchrun variables
(``TORCHRUN_VARS``); per node (``script.per: node``) only the ones that name no
rank.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_DIR_VAR = "HPCTRAIN_RUN_DIR"  # the run directory (the script's working directory unless script.workdir)
CHECKPOINT_DIR_VAR = "HPCTRAIN_CHECKPOINT_DIR"  # RUN_DIR/checkpoints: where a script keeps what it resumes from
RESTART_COUNT_VAR = "HPCTRAIN_RESTART_COUNT"  # 0 on the first start, +1 per requeue or relaunch
JOB_ID_VAR = "HPCTRAIN_JOB_ID"  # the Slurm job id (a local run: its controller's id)
# The signal hpctrain sends the script's process group when it must stop (time limit, preemption,
# cancel): its name without SIG (TERM, INT or USR1; script.stop_signal). hpctrain.task routes it to
# its stop flag.
STOP_SIGNAL_VAR = "HPCTRAIN_STOP_SIGNAL"
HEARTBEAT_INTERVAL_VAR = "HPCTRAIN_HEARTBEAT_INTERVAL_S"  # distributed.heartbeat_interval_s
HANG_TIMEOUT_VAR = "HPCTRAIN_HANG_TIMEOUT_S"  # distributed.hang_timeout_s; unset: no hang watchdog
# The run's micro-batches per step (its world size when it first started), set when a step runs on fewer
# nodes than the run started with (a node lost with min_nodes): hpctrain.task.ElasticLoader keeps the run's
# global batch from it before a checkpoint says so. Unset: the current world size.
RUN_MICRO_BATCHES_VAR = "HPCTRAIN_RUN_MICRO_BATCHES"

# The torchrun environment: every one for a process per rank; for a process per node (which starts
# its own workers) only those that name no single rank.
PER_RANK_VARS = ("RANK", "LOCAL_RANK")
PER_NODE_VARS = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_VARS = PER_RANK_VARS + PER_NODE_VARS

HPCTRAIN_VARS = (
    RUN_DIR_VAR,
    CHECKPOINT_DIR_VAR,
    RESTART_COUNT_VAR,
    JOB_ID_VAR,
    STOP_SIGNAL_VAR,
    HEARTBEAT_INTERVAL_VAR,
    HANG_TIMEOUT_VAR,
    RUN_MICRO_BATCHES_VAR,
)


@dataclass(frozen=True)
class ScriptCode:
    """Where a script job's program is on the nodes: its copy in the run directory, or the live file."""

    file: str | None  # the file run as ``python FILE`` (None for a module)
    module: str | None  # the module run as ``python -m MODULE``
    script_dir: str  # what {script_dir} names: the folder of the script (or of the module's file)
    python_path: str | None = None  # put first on PYTHONPATH (a module run from its snapshot)

    def program(self) -> list[str]:
        """The words after ``python``."""
        return [self.file] if self.file is not None else ["-m", str(self.module)]
