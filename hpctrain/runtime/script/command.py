"""What one process of a ``script:`` job runs: its placeholder values, command line, environment and folder.

Pure functions of the task's ``TaskEnv``, the spec and where the script's code
is (:class:`ScriptCode`, decided at submit): the task wrapper
(``programs/script_launcher.py``) starts exactly this, and ``submit --dry-run``
prints it for every rank from planned values (``plan_commands``). The variable
names are the contract's (``contract/script_env.py``). Torch-free.

Per rank (``script.per: rank``) a process is one rank and sees the torchrun
environment; per node it is the node's one process, which starts its own
workers (``mp.spawn``), and sees only the variables that name no rank:
``WORLD_SIZE`` is still the number of ranks (nodes x ``nproc_per_node``), as
torchrun and PyTorch's own multi-node examples count it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract import script_env
from hpctrain.contract.cpu_share import omp_num_threads
from hpctrain.contract.rundir import checkpoints_dir
from hpctrain.contract.script_env import ScriptCode
from hpctrain.jobspec.models import JobSpec, Script
from hpctrain.jobspec.script_args import fill
from hpctrain.jobspec.script_checks import REQUEUE_MARGIN_S
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.rank_plan import DERIVED_PORT_TEXT

TORCHRUN_PORT_TEXT = "<torchrun's port>"
PREEMPT_MARGIN_S = 5.0  # a preempted script is ended this long before the partition's GraceTime runs out


@dataclass(frozen=True)
class ScriptLayout:
    """One script process's place in the job: its rank (per rank) or its node (per node)."""

    per: str
    rank: int | None  # None per node
    local_rank: int | None
    node_rank: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: str

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


def layout(env: TaskEnv, spec: JobSpec) -> ScriptLayout:
    """This task's layout. A task per node counts nodes as its tasks (Slurm's SLURM_PROCID is the node's
    index, and a local run has no SLURM_NODEID), so its node is its global task rank."""
    script = _script(spec)
    if script.per == "node":
        return ScriptLayout(
            "node",
            None,
            None,
            env.global_rank,
            env.world_size,
            spec.tasks_per_node,
            env.master_addr,
            str(env.master_port),
        )
    return ScriptLayout(
        "rank",
        env.global_rank,
        env.local_rank,
        env.node_rank,
        env.num_nodes,
        env.local_world_size,
        env.master_addr,
        str(env.master_port),
    )


def placeholder_values(place: ScriptLayout, run_dir: str, code: ScriptCode, restart: int) -> dict[str, str]:
    """Every placeholder this process may use (``jobspec/script_args.py``); per node without the rank ones."""
    values = {
        "master_addr": place.master_addr,
        "master_port": place.master_port,
        "world_size": str(place.world_size),
        "node_rank": str(place.node_rank),
        "nnodes": str(place.nnodes),
        "nproc_per_node": str(place.nproc_per_node),
        "run_dir": run_dir,
        "checkpoint_dir": str(checkpoints_dir(Path(run_dir))),
        "restart": str(restart),
        "script_dir": code.script_dir,
    }
    if place.rank is not None:
        values.update(rank=str(place.rank), local_rank=str(place.local_rank))
    return values


def command(python: str, code: ScriptCode, script: Script, values: Mapping[str, str]) -> list[str]:
    """``python SCRIPT ARGS...`` (or ``python -m MODULE ARGS...``) with the arguments filled."""
    return [python, *code.program(), *(fill(arg, values) for arg in script.args)]


def workdir(script: Script, values: Mapping[str, str], run_dir: str) -> str:
    """The folder the script starts in: the run directory unless ``script.workdir``."""
    return fill(script.workdir, values) if script.workdir is not None else run_dir


def environ(
    base: Mapping[str, str],
    place: ScriptLayout,
    spec: JobSpec,
    *,
    run_dir: str,
    job_id: str,
    restart: int,
    code: ScriptCode,
    cpu_count: int | None = None,
    local: bool = False,
) -> dict[str, str]:
    """The script's environment: the task's, plus the torchrun variables and hpctrain's (contract/script_env.py).

    Per node, a ``RANK``/``LOCAL_RANK`` the task inherited is removed: that process is no rank. Python's
    output is unbuffered (the log shows each line as it is written) and each process gets its share of the
    CPUs in ``OMP_NUM_THREADS``, unless the user set either. Per node on this machine (``local``), each
    "node" sees its own GPUs (:func:`node_devices`).
    """
    env = dict(base)
    gpus = spec.resources.gpus_per_node or 0
    if local and place.rank is None and gpus:
        mine = node_devices(base.get("CUDA_VISIBLE_DEVICES"), place.node_rank, gpus)
        if mine is not None:
            env["CUDA_VISIBLE_DEVICES"] = mine
    torchrun = {
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_WORLD_SIZE": str(place.nproc_per_node),
        "GROUP_RANK": str(place.node_rank),
        "MASTER_ADDR": place.master_addr,
        "MASTER_PORT": place.master_port,
    }
    if place.rank is None:
        for name in script_env.PER_RANK_VARS:
            env.pop(name, None)
    else:
        torchrun.update(RANK=str(place.rank), LOCAL_RANK=str(place.local_rank))
    env.update(torchrun)
    hang = spec.distributed.hang_timeout
    env.update(
        {
            script_env.RUN_DIR_VAR: run_dir,
            script_env.CHECKPOINT_DIR_VAR: str(checkpoints_dir(Path(run_dir))),
            script_env.RESTART_COUNT_VAR: str(restart),
            script_env.JOB_ID_VAR: job_id,
            script_env.STOP_SIGNAL_VAR: _script(spec).stop_signal,
            script_env.HEARTBEAT_INTERVAL_VAR: f"{spec.distributed.heartbeat_interval_s:g}",
        }
    )
    if hang is not None:
        env[script_env.HANG_TIMEOUT_VAR] = f"{hang:g}"
    else:
        env.pop(script_env.HANG_TIMEOUT_VAR, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    sharers = place.nproc_per_node if place.rank is None else 1
    threads = omp_num_threads(base, sharers=sharers, cpu_count=cpu_count)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    if code.python_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (code.python_path, base.get("PYTHONPATH", "")) if p)
    return env


def node_devices(visible: str | None, node_rank: int, gpus_per_node: int) -> str | None:
    """A local "node"'s share of the run's ``CUDA_VISIBLE_DEVICES`` (``launch/submission.local_devices`` chose
    nodes x gpus_per_node of the user's): the node's process starts workers on ``cuda:0..``, so two nodes on
    one machine would otherwise share GPUs. None when the list holds no full share for the node."""
    items = [item.strip() for item in (visible or "").split(",") if item.strip()]
    mine = items[node_rank * gpus_per_node : (node_rank + 1) * gpus_per_node]
    return ",".join(mine) if len(mine) == gpus_per_node else None


def restart_count(job_ids: object, job_id: str, slurm_restarts: int, step_attempt: int) -> int:
    """``{restart}``: this start's number, the same on every process without talking. Pure.

    Earlier jobs of the run (``run.json``'s ``job_ids`` before this one: ``hpctrain resume``), plus this
    job's requeues (SLURM_RESTART_COUNT), plus the steps a healing job's supervisor started before this one.
    """
    earlier = 0
    if isinstance(job_ids, list):  # written right after sbatch returned: this job's id may not be there yet
        ids = [str(one) for one in job_ids]
        earlier = ids.index(job_id) if job_id in ids else len(ids)
    return earlier + max(0, slurm_restarts) + max(0, step_attempt)


def stop_timeout_s(reason: str, spec: JobSpec, preempt_grace_s: float | None) -> float | None:
    """How long the script may take to exit after the stop signal before its processes are killed; None:
    until Slurm ends the job. Pure.

    A time-limit stop must leave the requeue its time before the limit; a preemption ends at the
    partition's GraceTime (Slurm 24.05+ requeues a job still running then *and* keeps its preemption
    flag, so the script is ended a little before); a cancel is bounded by Slurm's KillWait.
    """
    script = _script(spec)
    if reason == "timeout":
        room = max(5.0, float(spec.signals.signal_delay_s - REQUEUE_MARGIN_S))
        return min(room, float(script.stop_timeout_s)) if script.stop_timeout_s is not None else room
    if script.stop_timeout_s is not None:
        return float(script.stop_timeout_s)
    if reason == "preempted" and preempt_grace_s is not None and preempt_grace_s > 2 * PREEMPT_MARGIN_S:
        return preempt_grace_s - PREEMPT_MARGIN_S
    return None


# ------------------------------------------------------------------ the dry run's view


def plan_commands(
    spec: JobSpec, run_dir: str, code: ScriptCode, python: str, hostnames: list[str] | None = None
) -> list[tuple[str, str, list[str]]]:
    """(who, working directory, command line) of every script process, before the job exists.

    Hosts are ``node0``.. and a derived port shows as its rule, as in the rank table.
    """
    script = _script(spec)
    nodes = spec.resources.nodes
    hostnames = hostnames or [f"node{index}" for index in range(nodes)]
    port = str(spec.distributed.master_port) if spec.distributed.master_port is not None else DERIVED_PORT_TEXT
    if spec.launcher == "torchrun":
        port = TORCHRUN_PORT_TEXT  # torchrun's agent picks its workers' MASTER_PORT
    rows = []
    per_node = 1 if script.per == "node" else spec.tasks_per_node
    for node_rank, host in enumerate(hostnames):
        for local in range(per_node):
            if script.per == "node":
                place = ScriptLayout("node", None, None, node_rank, nodes, spec.tasks_per_node, hostnames[0], port)
                who = f"node {node_rank} ({host})"
            else:
                rank = node_rank * per_node + local
                place = ScriptLayout("rank", rank, local, node_rank, nodes, per_node, hostnames[0], port)
                who = f"rank {rank} ({host})"
            values = placeholder_values(place, run_dir, code, 0)
            rows.append((who, workdir(script, values, run_dir), command(python, code, script, values)))
    return rows


def _script(spec: JobSpec) -> Script:
    if spec.script is None:
        raise ValueError("not a script job")
    return spec.script
