"""What Slurm says about a plan's shapes: the partition's limits, and when ``sbatch --test-only`` would start each.

Everything goes through the one client (``contract/slurm.py``). The options
asked are the run's own (``jobscript/parameters.py``'s ``slurm_parameters``, so
the question is the job ``submit`` would queue) at each node count, with the
time limit a chunk will have. Each way Slurm cannot answer becomes words in
the shape's row, never a start time: no Slurm on this machine, a controller
that does not answer, a refused ``--test-only``, a shape no node set of the
partition can ever hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.slurm_answers import DEFAULT_REQUEUE_HOLD_S
from hpctrain.errors import UsageError
from hpctrain.jobspec.slurm_time import parse_time_limit

if TYPE_CHECKING:
    from hpctrain.jobspec.load import LoadedJob

NEVER_FITS = "no node can ever satisfy the request"  # slurm_answers' meaning of such a refusal
# submitit's parameter names -> sbatch's (the ones a placement depends on; the rest come from additional_parameters)
FLAGS = {
    "nodes": "nodes",
    "ntasks_per_node": "ntasks-per-node",
    "cpus_per_task": "cpus-per-task",
    "mem": "mem",
    "exclusive": "exclusive",
    "gres": "gres",
    "gpus_per_node": "gpus-per-node",
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "constraint": "constraint",
}


@dataclass(frozen=True)
class Partition:
    """The limits a plan needs: ``max_time_s`` (None: unlimited), node counts (None: not said)."""

    name: str
    max_time_s: int | None
    total_nodes: int | None
    max_nodes: int | None


@dataclass(frozen=True)
class Start:
    """When a shape would start (seconds from now), or why it is not known (``unknown``) or impossible (``never``)."""

    in_s: float | None = None
    nodes: str = ""  # the nodes Slurm would give
    unknown: str = ""
    never: str = ""


def partition_of(fields: Mapping[str, str]) -> Partition:
    """A partition record of ``scontrol -o show partition`` (``slurm_answers.parse_partitions``). Pure."""
    return Partition(
        fields.get("PartitionName", "?"),
        _seconds(fields.get("MaxTime", "")),
        _count(fields.get("TotalNodes", "")),
        _count(fields.get("MaxNodes", "")),
    )


def find_partition(slurm: Slurm, name: str | None) -> tuple[Partition | None, str]:
    """The partition ``name`` (None: the cluster's default), or None and why it is not known; a name the
    cluster does not have is the spec's mistake (UsageError)."""
    try:
        records = slurm.partitions()
    except SlurmCommandError as exc:
        return None, f"the partition's limits are unknown ({exc.message})"
    if name is None:
        name = next((n for n, f in records.items() if f.get("Default") == "YES"), None)
        if name is None:
            return None, "no partition named and the cluster has no default one"
    if name not in records:
        known = ", ".join(sorted(records)) or "none"
        raise UsageError(
            f"resources.partition {name!r} is not a partition of this cluster ({known})",
            hint="set resources.partition (or --set resources.partition=P) to one 'sinfo -s' lists",
        )
    return partition_of(records[name]), ""


def test_only_options(job: LoadedJob, time_min: int) -> list[tuple[str, Any]]:
    """``sbatch`` options of the job ``submit`` would queue (``job`` loaded at the shape), for ``time_min``."""
    from hpctrain.jobscript.parameters import slurm_parameters  # here: status and report need not load it

    params = slurm_parameters(job.spec, job.profile, Path("/dev/null"))
    options: list[tuple[str, Any]] = [(flag, params.get(key)) for key, flag in FLAGS.items()]
    options.append(("time", time_min))
    options += [(name, value) for name, value in params.get("additional_parameters", {}).items()]
    return options


def start_of(slurm: Slurm, options: list[tuple[str, Any]], clock: Callable[[], float] = time.time) -> Start:
    """When Slurm would start a job with ``options`` (its ``--test-only`` answer), or why not."""
    try:
        found = slurm.test_only(options)
    except SlurmCommandError as exc:
        if exc.kind == "refused" and NEVER_FITS in exc.message:
            return Start(never=exc.message)
        if exc.kind == "missing":
            return Start(unknown="no Slurm on this machine (sbatch is not on PATH)")
        return Start(unknown=exc.message)
    return Start(in_s=max(0.0, found.start.timestamp() - clock()), nodes=found.nodes)


def _seconds(text: str) -> int | None:
    if text.upper() in ("UNLIMITED", "INFINITE", "NONE", ""):
        return None
    try:
        return parse_time_limit(text)
    except ValueError:
        return None


def _count(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def requeue_hold(expedited: bool | str, slurm: Slurm | None) -> tuple[float, str]:
    """Seconds Slurm holds a requeued chunk before it may start, and what says so: none with expedited
    requeue (``resources.expedited_requeue`` true, or auto where the cluster has it), else the cluster's
    job credential lifetime (``cred_expire``; Slurm's 120 s where no cluster answers)."""
    if slurm is None:
        return float(DEFAULT_REQUEUE_HOLD_S), "Slurm's default cred_expire; no cluster asked"
    if expedited is True or (expedited == "auto" and slurm.expedited_requeue().available):
        return 0.0, "expedited requeue: not held"
    return float(slurm.requeue_hold_s()), "the cluster's cred_expire: a requeued job's BeginTime"
