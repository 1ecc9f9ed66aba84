"""Who this task is, wherever it runs, and the state the task API keeps for it (one per process).

:func:`context` answers from, first match wins:

1. **an entry point** (``entrypoint: pkg.mod:main``): the ``TaskContext`` the
   launcher registered (``runtime/context.py``): its ranks, device, run
   directory and stop request; the launcher already runs its heartbeats;
2. **a script hpctrain runs** (``HPCTRAIN_RUN_DIR`` set; the names are
   ``contract/script_env.py``'s): the ranks of the process group once it is
   up, else of the torchrun variables hpctrain set; run and checkpoint
   directories, restart count and job id from hpctrain's variables;
   ``HPCTRAIN_STOP_SIGNAL`` becomes the stop request (a handler the script
   installed for it still runs, after hpctrain's), and this rank's
   heartbeat thread and hang watchdog start (``runtime/script/process.py``);
3. **anything else** (``python train.py``, ``torchrun``, a hand-written
   ``srun``): the ranks that launcher set, the working directory as the run
   directory, SIGTERM as the stop request, no heartbeats.

It resolves once, and once more when torch.distributed came up after the
first call (a per-node script's workers learn their rank from it).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from hpctrain.contract import script_env
from hpctrain.contract.cancel_marker import cancel_marker_paths
from hpctrain.contract.rundir import checkpoints_dir
from hpctrain.errors import DistributedSetupError
from hpctrain.runtime import heartbeat
from hpctrain.runtime.context import registered_context
from hpctrain.runtime.run_summary import UserRunSummary
from hpctrain.runtime.script import process as script_process
from hpctrain.runtime.stop import StopReason, StopRequest
from hpctrain.runtime.task_env import derive_task_env

Mode = Literal["entrypoint", "script", "local"]


@dataclass(frozen=True)
class TaskInfo:
    """This process's place in the job and where its files go."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    device: torch.device
    run_dir: Path
    checkpoint_dir: Path
    restart_count: int
    job_id: str
    hostname: str
    mode: Mode  # entrypoint, script (run by hpctrain) or local (anything else)

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one rank that writes the run's shared files."""
        return self.rank == 0

    @property
    def under_hpctrain(self) -> bool:
        return self.mode != "local"


@dataclass
class Session:
    """What the task API keeps for this process: who it is, its stop request, rank 0's summary."""

    info: TaskInfo
    stop: StopRequest
    with_process_group: bool  # resolved while torch.distributed was up
    summary: UserRunSummary | None = None
    monitor: heartbeat.Monitor | None = None
    agreed: StopReason | None = None  # the last answer of should_stop()
    stop_handler: script_process.StopHandler | None = None  # the task API's own (scripts, plain processes)
    extra: dict[str, Any] = field(default_factory=dict)


_session: Session | None = None
_lock = threading.Lock()


def context() -> TaskInfo:
    """This task's rank, world size, device, run and checkpoint directories, restart count (see the module doc)."""
    return session().info


def session() -> Session:
    """The process's session, resolved on first use (again once the process group is up)."""
    global _session
    with _lock:
        up = _distributed()
        if _session is None or (up and not _session.with_process_group):
            _session = _resolve(os.environ, previous=_session)
        return _session


def reset() -> None:
    """Forget the session (tests; a process that runs several tasks in turn)."""
    global _session
    with _lock:
        if _session is not None and _session.monitor is not None:
            _session.monitor.stop(final_phase=None)
        _session = None


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _resolve(environ: os._Environ[str] | dict[str, str], previous: Session | None) -> Session:
    ctx = registered_context()
    if ctx is not None:
        env = ctx.env
        info = TaskInfo(
            rank=env.global_rank,
            world_size=env.world_size,
            local_rank=env.local_rank,
            local_world_size=env.local_world_size,
            node_rank=env.node_rank,
            num_nodes=env.num_nodes,
            device=ctx.device,
            run_dir=Path(ctx.run_dir),
            checkpoint_dir=ctx.checkpoint_dir,
            restart_count=env.restart_count,
            job_id=env.job_id,
            hostname=env.hostname if env.hostnames else socket.gethostname(),
            mode="entrypoint",
        )
        made = Session(info=info, stop=ctx.stop, with_process_group=True)
        return _start(made, previous, hostnames=list(env.hostnames))
    script = script_env.RUN_DIR_VAR in environ
    info = _own_info(environ, script=script)
    handler = None
    if previous is not None:  # the same process, now with its process group: keep its stop request
        stop, handler = previous.stop, previous.stop_handler
    else:
        stop = StopRequest(cancel_markers=cancel_marker_paths(info.run_dir) if script else (), job_ids=[info.job_id])
        signum = script_process.stop_signal(environ) if script else signal.SIGTERM
        handler = script_process.install_stop_signal(stop, signum)  # keeps the script's own handler
    made = Session(info=info, stop=stop, with_process_group=_distributed(), stop_handler=handler)
    if previous is not None:
        made.agreed, made.monitor = previous.agreed, previous.monitor
    if script and made.monitor is None and (made.with_process_group or "RANK" in environ):
        made.monitor = script_process.start_script_monitor(
            info.run_dir, environ, rank=info.rank, node=info.hostname, pid=os.getpid(), job_id=info.job_id
        )
        if made.monitor is not None:
            _watch_exit(made.monitor)
    return _start(made, previous, hostnames=[])


def _watch_exit(monitor: heartbeat.Monitor) -> None:
    """A script's last heartbeat: ``done`` when it exits normally, its last phase when an exception ends it."""
    failed: list[bool] = []
    previous_hook = sys.excepthook

    def on_exception(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        failed.append(True)
        previous_hook(kind, value, tb)

    def at_exit() -> None:
        monitor.stop(final_phase=None if failed else "done")

    sys.excepthook = on_exception
    atexit.register(at_exit)


def _start(made: Session, previous: Session | None, *, hostnames: list[str]) -> Session:
    """Rank 0 of a run hpctrain started says ``running`` in summary.json (once per process)."""
    if previous is not None and previous.summary is not None:
        made.summary = previous.summary
    elif made.info.is_main and made.info.under_hpctrain and made.info.run_dir.is_dir():
        info = made.info
        facts = {
            "job_id": info.job_id,
            "world_size": info.world_size,
            "num_nodes": info.num_nodes,
            "hostnames": hostnames,
            "device": str(info.device),
        }
        made.summary = UserRunSummary(info.run_dir, facts, restart_count=info.restart_count)
        made.summary.start()
    return made


def _own_info(environ: os._Environ[str] | dict[str, str], *, script: bool) -> TaskInfo:
    """A script's or a plain process's TaskInfo (cases 2 and 3 of the module doc)."""
    run_dir = Path(environ.get(script_env.RUN_DIR_VAR) or Path.cwd())
    checkpoint_dir = Path(environ.get(script_env.CHECKPOINT_DIR_VAR) or checkpoints_dir(run_dir))
    if script:
        rank, world, local_rank, local_world, node_rank = _script_layout(environ)
        restart = _whole(environ, script_env.RESTART_COUNT_VAR, 0)
        job_id = environ.get(script_env.JOB_ID_VAR) or environ.get("SLURM_JOB_ID") or "local"
    else:
        env = derive_task_env(environ)
        rank, world, local_rank = env.global_rank, env.world_size, env.local_rank
        local_world, node_rank, restart, job_id = env.local_world_size, env.node_rank, env.restart_count, env.job_id
        if _distributed():
            rank, world = dist.get_rank(), dist.get_world_size()
    num_nodes = max(1, -(-world // max(1, local_world)))
    return TaskInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=num_nodes,
        device=_device(local_rank),
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        restart_count=restart,
        job_id=job_id,
        hostname=socket.gethostname(),
        mode="script" if script else "local",
    )


def _script_layout(environ: os._Environ[str] | dict[str, str]) -> tuple[int, int, int, int, int]:
    """(rank, world size, local rank, local world size, node rank): the process group's, else torchrun's."""
    world = _whole(environ, "WORLD_SIZE", 1, minimum=1)
    local_world = _whole(environ, "LOCAL_WORLD_SIZE", world, minimum=1)
    node_rank = _whole(environ, "GROUP_RANK", 0)
    if _distributed():
        rank, world = dist.get_rank(), dist.get_world_size()
    elif "RANK" in environ:
        rank = _whole(environ, "RANK", 0)
    else:
        raise DistributedSetupError(
            "hpctrain.task: this process has no rank yet: a script run once per node (script.per: node) "
            "learns its workers' ranks when they join the process group",
            hint="call hpctrain.task's functions in each worker after torch.distributed.init_process_group()",
        )
    local_rank = _whole(environ, "LOCAL_RANK", rank - node_rank * local_world)
    if not 0 <= local_rank < local_world:
        local_rank = rank % local_world
    return rank, world, local_rank, local_world, node_rank


def _whole(environ: os._Environ[str] | dict[str, str], name: str, default: int, *, minimum: int = 0) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    if not raw.strip().isdigit() or int(raw) < minimum:
        raise DistributedSetupError(f"{name}={raw!r} is not a whole number >= {minimum}", hint=f"fix or unset {name}")
    return int(raw)


def _device(local_rank: int) -> torch.device:
    """The device this process computes on: the current CUDA device under NCCL, else GPU local_rank, else CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    if _distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", local_rank % torch.cuda.device_count())
