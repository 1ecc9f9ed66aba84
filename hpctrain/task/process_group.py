"""One process group of every rank the launcher started: :func:`init_process_group`, never a rank training alone.

Under ``torchrun --nproc-per-node 2`` (or a hand-written ``srun``, or a
``script:`` job) each process knows from its environment that it is rank 1 of
2, but until ``torch.distributed.init_process_group()`` runs, nothing joins
them: ``task.ddp`` would return the bare model, the checkpointer and
``should_stop`` would act per process, and two trainings would write one
checkpoint folder. So the task API's collective parts (:func:`hpctrain.task.ddp`,
``Checkpointer``, ``ElasticLoader``, ``should_stop``) call :func:`require_group`
first: with a world size over 1 and no group, it forms the group from the
launcher's environment (``runtime/task_env.py``: torchrun's variables, Slurm's,
submitit's), or stops at once saying what is missing. Call
:func:`init_process_group` yourself at the top of the loop to make it explicit
(the example in docs/your-own-loop.md does); an entry point's launcher has
already made the group, and a single process needs none.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

from hpctrain.errors import DistributedSetupError
from hpctrain.runtime.process_group import start_process_group, task_device
from hpctrain.runtime.rank_plan import choose_backend
from hpctrain.runtime.task_env import derive_task_env
from hpctrain.task.session import TaskInfo, context, session

DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for a collective
CONNECT_TIMEOUT_S = 300.0  # how long a rank waits to reach rank 0 (not under torchrun: its agent waits)
# At exit, how long gloo's worker threads get to let go of the last collective's tensors (see _destroy).
SETTLE_AT_EXIT_S = 0.3
_settling = False  # the moment at exit is registered (settle_at_exit, or _destroy for a group formed here)


def init_process_group(backend: str = "auto", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> TaskInfo:
    """Join every rank the launcher started in torch.distributed's default group, once; this task's context.

    A no-op when the group is up (an entry point's launcher made it; you called torch's yourself) or for one
    process. ``backend``: ``auto`` (NCCL on GPUs, gloo on CPUs), ``nccl`` or ``gloo``. On GPUs this rank's
    device (by local rank) becomes the current CUDA device. The group is destroyed when the process exits.
    """
    if _up() or session().info.world_size <= 1:
        return context()
    try:
        env = derive_task_env(os.environ)
    except DistributedSetupError as exc:
        raise DistributedSetupError(
            f"hpctrain.task: this process is rank {session().info.rank} of {session().info.world_size}, but no "
            f"process group is up and the launcher's variables do not say how to form one ({exc})",
            hint="call torch.distributed.init_process_group() in every rank before the task API's ddp(), "
            "Checkpointer, ElasticLoader or should_stop(); or start the ranks with torchrun",
        ) from exc
    if env.world_size <= 1:
        raise DistributedSetupError(
            f"hpctrain.task: this process is rank {session().info.rank} of {session().info.world_size}, but the "
            "launcher's variables describe a single process, so no process group can be formed from them",
            hint="call torch.distributed.init_process_group() in every rank yourself, or start them with torchrun",
        )
    cuda = torch.cuda.is_available()
    device = task_device(env, use_cuda=cuda)
    chosen = choose_backend(backend, cuda=cuda)
    start_process_group(env, chosen, device, timeout_s=timeout_s, connect_timeout_s=CONNECT_TIMEOUT_S)
    global _settling
    _settling = True  # _destroy gives gloo's threads their moment: settle_at_exit adds no second one
    atexit.register(_destroy)
    if env.is_main:
        print(
            f"hpctrain.task: {env.world_size} ranks joined one process group ({chosen}, from {env.source}'s variables)",
            file=sys.stderr,
            flush=True,
        )
    return context()


def require_group(what: str) -> None:
    """Before ``what`` acts on every rank: the group is up (formed if the launcher's variables allow it)."""
    if _up():
        settle_at_exit()  # a group the script formed itself: its collectives' threads get the same moment
        return
    if session().info.world_size <= 1:
        return
    try:
        init_process_group()
    except DistributedSetupError as exc:
        raise DistributedSetupError(f"{what}: {exc.message}", hint=exc.hint) from exc


def settle_at_exit() -> None:
    """Once per process: at exit, before the interpreter finalizes, the main thread gives gloo's worker
    threads the moment :func:`_destroy` gives them, also for a group the script formed (and perhaps
    destroyed) itself: a worker thread outlives ``destroy_process_group`` while anything (a DDP model, a
    comm hook) still holds the group. Seen: a 2-rank DDP loop with a comm hook that formed and destroyed
    its own group, rank 0 aborting at exit in 2 of ~12 runs at a load of 5 (CI 49); 0 of 30 with this."""
    global _settling
    if not _settling:
        _settling = True
        atexit.register(time.sleep, SETTLE_AT_EXIT_S)


def _up() -> bool:
    return dist.is_available() and dist.is_initialized()


def _destroy() -> None:
    """At exit, while the interpreter is whole: let the collectives' worker threads finish, then end the group.

    A gloo worker thread lets go of a finished collective's work a moment after the caller's ``wait``
    returned; the work holds the caller's tensors, and letting go of a tensor that has a Python object takes
    the GIL. When that moment falls after the interpreter began finalizing (a loaded machine, the last
    collective right before exit), taking the GIL ends the thread inside C++ and the process aborts
    ("terminate called without an active exception", SIGABRT; rank 1 of 2 in 1 of ~15 runs under load, the
    core showing ``ProcessGroupGloo::runLoop`` -> ``~AsyncAllreduceWork`` -> ``decref_pyobject``). Nothing
    in torch waits for that (``destroy_process_group`` neither joins gloo's threads nor waits for them;
    pytorch PR 179291 tried an atexit hook and was abandoned), so the main thread sleeps, giving up the GIL
    and the CPU, long enough for a descheduled worker to run its last few instructions.
    """
    if _up():
        time.sleep(SETTLE_AT_EXIT_S)
        dist.destroy_process_group()
