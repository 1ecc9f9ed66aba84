"""Which rank runs where, on which device, with which backend: decided without torch.

``plan_ranks`` is what ``hpctrain submit --dry-run`` prints before anything is
allocated. It uses the same two decisions the compute nodes make at start-up,
``select_device_index`` and ``choose_backend``, so the table cannot drift from
what the tasks will really do. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from hpctrain.errors import DistributedSetupError, UsageError, printable

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

Backend = Literal["nccl", "gloo"]
# Shown instead of a port before the job id exists; see hpctrain.runtime.master.
DERIVED_PORT_TEXT = "<port from job id>"


@dataclass(frozen=True)
class RankPlan:
    """What one rank will see once the job starts."""

    rank: int
    local_rank: int
    node_rank: int
    node: str
    device: str  # "cuda:<i>" as numbered among the node's GPUs, or "cpu"
    backend: Backend | None  # None: a single task starts no process group
    master: str  # "addr:port"


def select_device_index(local_rank: int, local_world_size: int, visible_devices: str | None, device_count: int) -> int:
    """The CUDA device index this task should use.

    Two layouts are common and both are right:
    - every task sees all the node's GPUs (``--gres=gpu:N``): use ``local_rank``;
    - Slurm binds one GPU per task (``--gpus-per-task=1``, ``--gpu-bind``):
      CUDA_VISIBLE_DEVICES has one entry and that GPU is ``cuda:0``.
    ``device_count`` (what CUDA sees) decides; ``visible_devices`` is for the message.
    """
    if device_count < 1:
        raise DistributedSetupError(
            f"no CUDA device is visible to local rank {local_rank} (CUDA_VISIBLE_DEVICES={visible_devices!r})",
            hint="request GPUs (resources.gpus_per_node) or set it to 0 for a CPU job",
        )
    if device_count == 1:
        return 0
    if local_rank < device_count:
        return local_rank
    raise DistributedSetupError(
        f"local rank {local_rank} of {local_world_size} tasks on this node has no GPU of its own: "
        f"{device_count} visible (CUDA_VISIBLE_DEVICES={visible_devices!r})",
        hint="run one task per GPU: set resources.tasks_per_node to resources.gpus_per_node",
    )


def local_visible_devices(visible: str | None, count: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a local run's tasks that need ``count`` GPUs: the first ``count`` of
    the devices the user made visible (indices or ``GPU-``/``MIG-`` UUIDs, kept as written), or
    ``0..count-1`` when the variable is unset. A machine without device cgroups shares its GPUs, so
    the user's choice is the fence; fewer visible devices than asked is a ``UsageError``.

    As CUDA reads the list, it ends at the first entry that is neither an index nor a UUID.
    """
    if count <= 0:
        return ""  # a CPU job sees no GPU
    if visible is None:
        return ",".join(str(index) for index in range(count))
    devices: list[str] = []
    for entry in (item.strip() for item in visible.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        devices.append(entry)
    if len(devices) < count:
        shown = printable(visible if len(visible) <= 120 else visible[:117] + "...")
        raise UsageError(
            f"the job asks for {count} GPU{'s' * (count != 1)} on this machine, but CUDA_VISIBLE_DEVICES="
            f"'{shown}' makes only {len(devices)} visible",
            hint=f"list at least {count} of your GPUs in CUDA_VISIBLE_DEVICES (or unset it to use GPUs "
            f"0-{count - 1}), or ask for fewer with resources.gpus_per_node",
        )
    return ",".join(devices[:count])


def choose_backend(requested: str, *, cuda: bool) -> Backend:
    """``distributed.backend`` -> the backend to start: NCCL on GPUs, gloo on CPUs."""
    if requested == "auto":
        return "nccl" if cuda else "gloo"
    if requested == "nccl" and not cuda:
        raise DistributedSetupError(
            "distributed.backend is 'nccl' but this job runs on CPUs",
            hint="set distributed.backend: gloo (or auto), or request GPUs with resources.gpus_per_node",
        )
    if requested not in ("nccl", "gloo"):
        raise DistributedSetupError(f"unknown distributed.backend {requested!r}", hint="use auto, nccl or gloo")
    return requested  # type: ignore[return-value]


def plan_ranks(spec: JobSpec, hostnames: list[str] | None = None) -> list[RankPlan]:
    """One ``RankPlan`` per rank, in rank order (Slurm's default block distribution).

    Before allocation the hostnames are unknown: placeholders ``node0``..
    stand in. Without ``distributed.master_port`` the port depends on the job
    id, so the master shows ``DERIVED_PORT_TEXT`` instead of a number.
    """
    nodes = spec.resources.nodes
    tasks_per_node = spec.tasks_per_node
    if hostnames is None:
        hostnames = [f"node{index}" for index in range(nodes)]
    if len(hostnames) != nodes:
        raise DistributedSetupError(
            f"{len(hostnames)} hostnames given for a {nodes}-node job",
            hint="pass one hostname per node (resources.nodes)",
        )
    gpus = spec.resources.gpus_per_node or 0
    world_size = nodes * tasks_per_node
    backend = choose_backend(spec.distributed.backend, cuda=gpus > 0) if world_size > 1 else None
    port = spec.distributed.master_port
    master = f"{hostnames[0]}:{port if port is not None else DERIVED_PORT_TEXT}" if world_size > 1 else "-"
    plans = []
    for node_rank, node in enumerate(hostnames):
        for local_rank in range(tasks_per_node):
            device = "cpu"
            if gpus:
                device = f"cuda:{select_device_index(local_rank, tasks_per_node, None, gpus)}"
            plans.append(
                RankPlan(
                    rank=node_rank * tasks_per_node + local_rank,
                    local_rank=local_rank,
                    node_rank=node_rank,
                    node=node,
                    device=device,
                    backend=backend,
                    master=master,
                )
            )
    return plans


def render_rank_table(plans: list[RankPlan], *, max_rows: int = 16) -> str:
    """A plain-text table of the plan; long plans keep their first and last rows."""
    header = ("rank", "local", "node", "device", "backend", "master")
    rows = [(str(p.rank), str(p.local_rank), p.node, p.device, p.backend or "none", p.master) for p in plans]
    if len(rows) > max_rows:
        half = max_rows // 2
        skipped = len(rows) - 2 * half
        rows = rows[:half] + [("...", "", f"({skipped} more ranks)", "", "", "")] + rows[-half:]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)
