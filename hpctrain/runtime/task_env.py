"""Environment variables -> ``TaskEnv``: who this task is and where rank 0 listens.

Pure functions over a mapping (tests pass plain dicts; the launcher passes
``os.environ``). Each launcher that can start us has a table of the variables
it sets, like submitit's ``_env`` tables. Sources, first match wins:

1. submitit's local executor (``SUBMITIT_EXECUTOR=local``) -- checked first
   because a local run started inside an ``salloc`` shell also sees SLURM_*;
2. hpctrain's torchrun launcher (``HPCTRAIN_LAUNCHER=torchrun``, torchrun's
   variables and the node task's SLURM_*): ranks from torchrun, the job (id,
   restarts, nodes) from Slurm -- so it requeues like an srun task;
3. torchrun (``TORCHELASTIC_RUN_ID`` set): it started this very process, so
   its ranks are the truth even inside a Slurm step;
4. Slurm (``SLURM_JOB_ID`` and ``SLURM_PROCID``);
5. torchrun-style variables set by hand (``RANK`` and ``WORLD_SIZE``);
6. otherwise a single process.

A missing, malformed or contradictory variable is a ``DistributedSetupError``
that names it and its value: a wrong rank layout otherwise shows up as a hang.
Nothing here imports torch (login nodes import this for ``--dry-run``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import replace

from submitit.slurm.slurm import SlurmParseException, _parse_node_list

from hpctrain.contract.cpu_share import omp_num_threads
from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.context import EnvSource, TaskEnv
from hpctrain.runtime.master import derive_master_port

LOCALHOST = "127.0.0.1"

# The variables each launcher sets, by what they mean.
SLURM_VARS = {
    "job_id": "SLURM_JOB_ID",
    "global_rank": "SLURM_PROCID",
    "world_size": "SLURM_NTASKS",
    "local_rank": "SLURM_LOCALID",
    "node_rank": "SLURM_NODEID",
    "restart_count": "SLURM_RESTART_COUNT",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
}
# The step's view wins over the job's: ranks, node ids and tasks per node are
# those of the srun step we run in, which may use part of the allocation.
SLURM_NODELIST_VARS = (("SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES"), ("SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES"))
SLURM_TASKS_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")

# submitit.local.local.LocalJobEnvironment._env and start_controller().
SUBMITIT_LOCAL_VARS = {
    "job_id": "SUBMITIT_LOCAL_JOB_ID",
    "global_rank": "SUBMITIT_LOCAL_GLOBALID",
    "world_size": "SUBMITIT_LOCAL_NTASKS",
    "local_rank": "SUBMITIT_LOCAL_LOCALID",
    "node_rank": "SUBMITIT_LOCAL_NODEID",
    "num_nodes": "SUBMITIT_LOCAL_JOB_NUM_NODES",
}

# torch.distributed.elastic.agent.server.local_elastic_agent sets these.
TORCHRUN_VARS = {
    "global_rank": "RANK",
    "world_size": "WORLD_SIZE",
    "local_rank": "LOCAL_RANK",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "node_rank": "GROUP_RANK",
    "num_nodes": "GROUP_WORLD_SIZE",
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "job_id": "TORCHELASTIC_RUN_ID",
    "restart_count": "TORCHELASTIC_RESTART_COUNT",
}

# Set by hpctrain's node task (programs/torchrun_node.py) for the torchrun it starts.
LAUNCHER_VAR = "HPCTRAIN_LAUNCHER"

_TASKS_PER_NODE_ITEM = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def detect_source(environ: Mapping[str, str]) -> EnvSource:
    """Which launcher started this process (see the module docstring for the order)."""
    if environ.get("SUBMITIT_EXECUTOR") == "local" and SUBMITIT_LOCAL_VARS["job_id"] in environ:
        return "submitit-local"
    if "TORCHELASTIC_RUN_ID" in environ:
        ours = environ.get(LAUNCHER_VAR) == "torchrun" and "SLURM_JOB_ID" in environ
        return "slurm-torchrun" if ours else "torchrun"
    if "SLURM_JOB_ID" in environ and "SLURM_PROCID" in environ:
        return "slurm"
    if SUBMITIT_LOCAL_VARS["job_id"] in environ:
        return "submitit-local"
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return "torchrun"
    return "single"


def derive_task_env(environ: Mapping[str, str], *, spec_master_port: int | None = None) -> TaskEnv:
    """The rank layout of this task. ``spec_master_port`` is ``distributed.master_port``.

    Master port, first match wins: the spec's, then MASTER_PORT, then one
    derived from the job id and restart count. Under torchrun its own
    MASTER_PORT wins, because its agent's store may already listen there.
    """
    source = detect_source(environ)
    if source == "slurm":
        return _from_slurm(environ, spec_master_port)
    if source == "submitit-local":
        return _from_submitit_local(environ, spec_master_port)
    if source == "torchrun":
        return _from_torchrun(environ)
    if source == "slurm-torchrun":
        return _from_slurm_torchrun(environ)
    job_id = "single"
    return one_node_env("single", 0, 1, 0, job_id, _master_port(environ, spec_master_port, job_id, 0))


def export_torchrun_env(env: TaskEnv, environ: MutableMapping[str, str]) -> None:
    """Set RANK, WORLD_SIZE, LOCAL_RANK, ... so torchrun-style user code runs unchanged."""
    environ.update(env.torchrun_env())


def parse_hostlist(nodelist: str, *, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand a Slurm hostlist (``n[1-2],gpu-[001,003]``) with submitit's parser."""
    try:
        hostnames = _parse_node_list(nodelist.strip())
    except SlurmParseException as exc:
        raise DistributedSetupError(
            f"{variable}={nodelist!r} is not a Slurm hostlist", hint="expected a form such as 'node[01-04],gpu7'"
        ) from exc
    if not hostnames or any(not name or any(c in name for c in "[]") for name in hostnames):
        raise DistributedSetupError(
            f"{variable}={nodelist!r} is not a Slurm hostlist", hint="expected a form such as 'node[01-04],gpu7'"
        )
    return hostnames


def parse_tasks_per_node(value: str, *, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's compressed counts: ``2(x3),1`` -> ``[2, 2, 2, 1]``."""
    counts: list[int] = []
    for item in value.strip().split(","):
        match = _TASKS_PER_NODE_ITEM.match(item.strip())
        if match is None:
            raise DistributedSetupError(
                f"{variable}={value!r} is not a list of task counts", hint="expected a form such as '4(x2),2'"
            )
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        counts.extend([count] * repeat)
    return counts


def _from_slurm(environ: Mapping[str, str], spec_master_port: int | None) -> TaskEnv:
    names = SLURM_VARS
    raw_job_id = _require(environ, names["job_id"])
    global_rank = _int(environ, names["global_rank"])
    world_size = _int(environ, names["world_size"], minimum=1)
    local_rank = _int(environ, names["local_rank"])
    node_rank = _int(environ, names["node_rank"])
    restart_count = _int(environ, names["restart_count"], default=0)
    _check_below(names["global_rank"], global_rank, world_size, f"{names['world_size']}={world_size}")

    hostnames, list_var = _slurm_hostnames(environ)
    why = f"{list_var}={environ[list_var]!r} names {len(hostnames)} hosts"
    _check_below(names["node_rank"], node_rank, len(hostnames), why)
    local_world_size, why = _slurm_local_world_size(environ, node_rank, len(hostnames), world_size)
    _check_below(names["local_rank"], local_rank, local_world_size, why)

    job_id, aliases = _slurm_job_ids(environ)
    return TaskEnv(
        global_rank=global_rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=len(hostnames),
        hostnames=tuple(hostnames),
        master_addr=hostnames[0],
        master_port=_master_port(environ, spec_master_port, raw_job_id, restart_count),
        job_id=job_id,
        restart_count=restart_count,
        source="slurm",
        job_aliases=aliases,
    )


def _slurm_job_ids(environ: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """This job's id as users know it, and every id that names it (see ``TaskEnv.job_aliases``)."""
    raw_job_id = _require(environ, SLURM_VARS["job_id"])
    array_job_id = environ.get(SLURM_VARS["array_job_id"])
    array_task_id = environ.get(SLURM_VARS["array_task_id"])
    # Named like submitit's job.job_id (what users see); the port uses the raw
    # SLURM_JOB_ID, which differs per array task.
    job_id = f"{array_job_id}_{array_task_id}" if array_job_id and array_task_id else raw_job_id
    return job_id, tuple(dict.fromkeys(i for i in (raw_job_id, array_job_id, job_id) if i))


def _slurm_hostnames(environ: Mapping[str, str]) -> tuple[list[str], str]:
    for list_var, count_var in SLURM_NODELIST_VARS:
        if environ.get(list_var):
            hostnames = parse_hostlist(environ[list_var], variable=list_var)
            if count_var in environ:
                expected = _int(environ, count_var, minimum=1)
                if expected != len(hostnames):
                    raise DistributedSetupError(
                        f"{list_var}={environ[list_var]!r} names {len(hostnames)} hosts "
                        f"but {count_var}={environ[count_var]}",
                        hint="the Slurm environment is inconsistent; was it copied from another job?",
                    )
            return hostnames, list_var
    raise DistributedSetupError(
        "SLURM_JOB_NODELIST is not set", hint="hpctrain tasks must be started by srun inside a Slurm job"
    )


def _slurm_local_world_size(
    environ: Mapping[str, str], node_rank: int, num_nodes: int, world_size: int
) -> tuple[int, str]:
    """Tasks on this node, and where that number came from (for error messages)."""
    variable = next((name for name in SLURM_TASKS_PER_NODE_VARS if environ.get(name)), None)
    if variable is None:
        if world_size % num_nodes:
            raise DistributedSetupError(
                f"SLURM_TASKS_PER_NODE is not set and SLURM_NTASKS={world_size} does not divide over {num_nodes} nodes",
                hint="hpctrain tasks must be started by srun inside a Slurm job",
            )
        return world_size // num_nodes, f"SLURM_NTASKS={world_size} over {num_nodes} nodes"
    counts = parse_tasks_per_node(environ[variable], variable=variable)
    if len(counts) != num_nodes:
        raise DistributedSetupError(
            f"{variable}={environ[variable]!r} describes {len(counts)} nodes but the node list has {num_nodes}",
            hint="the Slurm environment is inconsistent; was it copied from another job?",
        )
    if sum(counts) != world_size:
        raise DistributedSetupError(
            f"{variable}={environ[variable]!r} adds up to {sum(counts)} tasks but SLURM_NTASKS={world_size}",
            hint="the Slurm environment is inconsistent; was it copied from another job?",
        )
    return counts[node_rank], f"{variable}={environ[variable]!r} puts {counts[node_rank]} tasks on node {node_rank}"


def _from_submitit_local(environ: Mapping[str, str], spec_master_port: int | None) -> TaskEnv:
    names = SUBMITIT_LOCAL_VARS
    job_id = _require(environ, names["job_id"])
    global_rank = _int(environ, names["global_rank"])
    world_size = _int(environ, names["world_size"], minimum=1)
    local_rank = _int(environ, names["local_rank"], default=global_rank)
    node_rank = _int(environ, names["node_rank"], default=0)
    num_nodes = _int(environ, names["num_nodes"], default=1, minimum=1)
    _check_below(names["global_rank"], global_rank, world_size, f"{names['world_size']}={world_size}")
    if num_nodes != 1:
        raise DistributedSetupError(f"{names['num_nodes']}={num_nodes} but submitit's local executor runs one node")
    _check_below(names["node_rank"], node_rank, num_nodes, f"{names['num_nodes']}={num_nodes}")
    _check_below(names["local_rank"], local_rank, world_size, f"{names['world_size']}={world_size}")
    master_port = _master_port(environ, spec_master_port, job_id, 0)
    # The controller's PID is the job id a local run's cancel marker names (launch/local_run.py).
    env = one_node_env("submitit-local", global_rank, world_size, local_rank, job_id, master_port)
    return replace(env, job_aliases=(job_id,))


def one_node_env(
    source: EnvSource, global_rank: int, world_size: int, local_rank: int, job_id: str, master_port: int
) -> TaskEnv:
    """Every rank on this machine: one node, master on localhost, never restarted."""
    return TaskEnv(
        global_rank=global_rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=world_size,
        node_rank=0,
        num_nodes=1,
        hostnames=("localhost",),
        master_addr=LOCALHOST,
        master_port=master_port,
        job_id=job_id,
        restart_count=0,
        source=source,
    )


def _from_torchrun(environ: Mapping[str, str]) -> TaskEnv:
    names = TORCHRUN_VARS
    global_rank = _int(environ, names["global_rank"])
    world_size = _int(environ, names["world_size"], minimum=1)
    local_rank = _int(environ, names["local_rank"], default=0 if world_size == 1 else None)
    num_nodes = _int(environ, names["num_nodes"], default=1, minimum=1)
    local_world_size = _int(environ, names["local_world_size"], default=world_size // num_nodes, minimum=1)
    node_rank = _int(environ, names["node_rank"], default=global_rank // local_world_size)
    _check_below(names["global_rank"], global_rank, world_size, f"{names['world_size']}={world_size}")
    _check_below(names["local_rank"], local_rank, local_world_size, f"{names['local_world_size']}={local_world_size}")
    _check_below(names["node_rank"], node_rank, num_nodes, f"{names['num_nodes']}={num_nodes}")
    if world_size > 1:
        master_addr = _require(environ, names["master_addr"])
        master_port = _port(environ, names["master_port"])
    else:
        master_addr = environ.get(names["master_addr"], LOCALHOST)
        master_port = _port(environ, names["master_port"]) if names["master_port"] in environ else 0
    job_id = environ.get(names["job_id"], "torchrun")
    restart_count = _int(environ, names["restart_count"], default=0)
    if not master_port:
        master_port = derive_master_port(job_id, restart_count)
    return TaskEnv(
        global_rank=global_rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        hostnames=(),  # torchrun does not say which hosts take part
        master_addr=master_addr,
        master_port=master_port,
        job_id=job_id,
        restart_count=restart_count,
        source="torchrun",
    )


def _from_slurm_torchrun(environ: Mapping[str, str]) -> TaskEnv:
    """A worker of the torchrun that hpctrain's node task started in a Slurm job.

    torchrun knows the ranks and the rendezvous endpoint; Slurm knows the job:
    its id (requeue, cancel markers), SLURM_RESTART_COUNT (torchrun itself
    never restarts: ``--max-restarts 0``), the nodes and which one this is.
    """
    ranks = _from_torchrun(environ)
    job_id, aliases = _slurm_job_ids(environ)
    hostnames, list_var = _slurm_hostnames(environ)
    if ranks.num_nodes != len(hostnames):
        raise DistributedSetupError(
            f"torchrun's {TORCHRUN_VARS['num_nodes']}={ranks.num_nodes} but {list_var}={environ[list_var]!r} "
            f"names {len(hostnames)} hosts",
            hint="torchrun must run once on every node of the job (one Slurm task per node)",
        )
    slurm_node = _int(environ, SLURM_VARS["node_rank"])
    _check_below(SLURM_VARS["node_rank"], slurm_node, len(hostnames), f"{list_var} names {len(hostnames)} hosts")
    return replace(
        ranks,
        hostnames=tuple(hostnames),
        node_name=hostnames[slurm_node],
        job_id=job_id,
        restart_count=_int(environ, SLURM_VARS["restart_count"], default=0),
        source="slurm-torchrun",
        job_aliases=aliases,
    )


def _master_port(environ: Mapping[str, str], spec_master_port: int | None, job_id: str, restart_count: int) -> int:
    if spec_master_port is not None:
        return spec_master_port
    if "MASTER_PORT" in environ:
        return _port(environ, "MASTER_PORT")
    return derive_master_port(job_id, restart_count)


def _require(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise DistributedSetupError(
            f"{name} is not set", hint="hpctrain tasks must be started by srun, submitit or torchrun"
        )
    return value


def _int(environ: Mapping[str, str], name: str, *, default: int | None = None, minimum: int = 0) -> int:
    if name not in environ and default is not None:
        return default
    raw = _require(environ, name)
    try:
        value = int(raw)
    except ValueError:
        raise DistributedSetupError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise DistributedSetupError(f"{name}={value} must be >= {minimum}")
    return value


def _port(environ: Mapping[str, str], name: str) -> int:
    port = _int(environ, name, minimum=1)
    if port > 65535:
        raise DistributedSetupError(f"{name}={port} is not a TCP port (1-65535)")
    return port


def _check_below(name: str, value: int, limit: int, why: str) -> None:
    if value >= limit:
        raise DistributedSetupError(
            f"{name}={value} must be below {limit} ({why}); ranks count from 0",
            hint="the task environment is inconsistent; start tasks with srun inside the job's allocation",
        )


def rank_hint(environ: Mapping[str, str]) -> str:
    """This task's rank for an error report written before the environment could be derived."""
    if "TORCHELASTIC_RUN_ID" in environ:  # a torchrun worker also inherits its node task's SLURM_PROCID
        return environ.get(TORCHRUN_VARS["global_rank"]) or "?"
    return environ.get(SLURM_VARS["global_rank"]) or environ.get(SUBMITIT_LOCAL_VARS["global_rank"]) or "?"


def thread_env(environ: Mapping[str, str], cpu_count: int | None = None) -> dict[str, str]:
    """``OMP_NUM_THREADS`` = the task's share of the CPUs unless the user set it; the rule is contract/cpu_share.py."""
    threads = omp_num_threads(environ, cpu_count=cpu_count)
    return {} if threads is None else {"OMP_NUM_THREADS": threads}
