"""Start and stop this task's process group; pick and bind its device.

One task per GPU: each task binds its device (``select_device_index``), then
joins a process group (NCCL on GPUs, gloo on CPUs) through a TCPStore hosted
by rank 0 at ``master_addr:master_port``. Failures that would otherwise hang
until the collective timeout -- a taken port, an unreachable master -- are
turned into ``DistributedSetupError`` within a bounded time. Compute nodes
only: this module imports torch.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from hpctrain.errors import DistributedSetupError
from hpctrain.jobspec.models import Distributed
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.master import check_port_free
from hpctrain.runtime.rank_plan import Backend, choose_backend, select_device_index
from hpctrain.runtime.task_env import export_torchrun_env

__all__ = ["NCCL_DEFAULTS", "export_torchrun_env", "nccl_environment", "process_group", "start_process_group"]

# Set only where the user's environment does not already say otherwise;
# distributed.nccl_env overrides both.
NCCL_DEFAULTS = {
    # A failed or timed-out collective tears the process down (and srun
    # --kill-on-bad-exit the step) instead of leaving every rank hanging.
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    # NCCL's own warnings name the failing peer and transport; silence costs hours.
    "NCCL_DEBUG": "WARN",
}


@contextmanager
def process_group(
    env: TaskEnv, dist_spec: Distributed, *, use_cuda: bool, connect_timeout_s: float | None = None
) -> Iterator[torch.device]:
    """Bind this task's device and, when there are several tasks, join the process group.

    Yields the device. A single task starts no process group at all.
    ``connect_timeout_s`` bounds how long a rank waits to reach the master
    (default: ``dist_spec.timeout_s``).
    """
    device = task_device(env, use_cuda=use_cuda)
    if env.world_size == 1:
        yield device
        return
    backend = choose_backend(dist_spec.backend, cuda=device.type == "cuda")
    if backend == "nccl":
        os.environ.update(nccl_environment(dist_spec.nccl_env, os.environ))
    start_process_group(
        env,
        backend,
        device,
        timeout_s=dist_spec.timeout_s,
        connect_timeout_s=dist_spec.timeout_s if connect_timeout_s is None else connect_timeout_s,
    )
    try:
        yield device
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def task_device(env: TaskEnv, *, use_cuda: bool) -> torch.device:
    """The device this task computes on; on GPUs also made the current CUDA device."""
    if not use_cuda:
        return torch.device("cpu")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not torch.cuda.is_available():
        raise DistributedSetupError(
            f"the job asks for GPUs but CUDA is not available on {socket.gethostname()} "
            f"(CUDA_VISIBLE_DEVICES={visible!r})",
            hint="check the job's GPU request and the node's driver, or set resources.gpus_per_node: 0 for a CPU run",
        )
    index = select_device_index(env.local_rank, env.local_world_size, visible, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def nccl_environment(nccl_env: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set before NCCL starts: defaults not already set, then the spec's."""
    chosen = {name: value for name, value in NCCL_DEFAULTS.items() if name not in environ}
    chosen.update(nccl_env)
    return chosen


def start_process_group(
    env: TaskEnv, backend: Backend, device: torch.device, *, timeout_s: float, connect_timeout_s: float
) -> None:
    """Join the default process group (any world size, even 1).

    Under torchrun (started by hand or by hpctrain's torchrun launcher), its
    ``env://`` rendezvous is used (its agent may already host the store).
    Otherwise rank 0 checks the port is free and hosts a TCPStore; the
    others connect within ``connect_timeout_s``. The store then takes the
    collective timeout, which gloo's and NCCL's set-up also wait on.
    """
    timeout = timedelta(seconds=timeout_s)
    device_id = device if backend == "nccl" else None
    if env.source in ("torchrun", "slurm-torchrun"):
        export_torchrun_env(env, os.environ)
        dist.init_process_group(backend, init_method="env://", timeout=timeout, device_id=device_id)
        return
    store = _connect_store(env, connect_timeout_s)
    store.set_timeout(timeout)
    dist.init_process_group(
        backend, store=store, rank=env.global_rank, world_size=env.world_size, timeout=timeout, device_id=device_id
    )


def _connect_store(env: TaskEnv, connect_timeout_s: float) -> dist.TCPStore:
    if env.is_main:
        check_port_free(env.master_port)
    try:
        return dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            is_master=env.is_main,
            timeout=timedelta(seconds=connect_timeout_s),
            wait_for_workers=False,
        )
    except RuntimeError as exc:  # DistNetworkError/DistStoreError are RuntimeErrors
        here = socket.gethostname()
        if env.is_main:
            raise DistributedSetupError(
                f"rank 0 could not listen on port {env.master_port} on {here}: {exc}",
                hint="set distributed.master_port to a free port",
            ) from exc
        raise DistributedSetupError(
            f"rank {env.global_rank} on {here} could not reach the master {env.master_addr}:{env.master_port} "
            f"within {connect_timeout_s:g} s: {exc}",
            hint=f"see rank 0's log: it may have failed first; otherwise check that {env.master_addr!r} resolves "
            f"to the same address on every node and that port {env.master_port} is not firewalled",
        ) from exc
