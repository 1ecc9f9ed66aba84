"""What ``hpctrain init`` writes when a flag is not given: defaults that follow where you are.

A spec drafted on a laptop or a CPU box should run there; one drafted on a
cluster's login node should ask for that cluster. So, first match wins:

* the cluster: ``--cluster``; else ``$HPCTRAIN_CLUSTER``; else, where Slurm's
  clients are on PATH, the profile named like Slurm's ``ClusterName`` (HAL's
  login node: ``hal``), or ``slurm`` (any Slurm cluster); else ``local``;
* GPUs per node: ``--gpus-per-node``; else on ``local`` the GPUs this machine
  shows (NVIDIA's driver, limited by ``CUDA_VISIBLE_DEVICES``), on a Slurm
  profile the profile's (``hal``: 4);
* tasks per node: ``--tasks-per-node``; else the spec's default (one per GPU,
  one on CPUs).

A ``local`` spec asking for more GPUs than the machine shows is refused with
the count. Pure functions over what :func:`look_around` found (tests pass a
:class:`Here`); torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract.slurm import Slurm
from hpctrain.errors import ClusterError, UsageError
from hpctrain.jobspec.profiles import ClusterProfile, available_profiles, load_profile

CLUSTER_VAR = "HPCTRAIN_CLUSTER"
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the driver sees


@dataclass(frozen=True)
class Here:
    """What this machine offers a job: Slurm (and its cluster's name), GPUs."""

    slurm: bool
    slurm_cluster: str  # Slurm's ClusterName ("" unknown)
    gpus: int


@dataclass(frozen=True)
class InitDefaults:
    """The cluster, its profile, GPUs and tasks per node a draft asks for, and why (for the message)."""

    cluster: str
    profile: ClusterProfile
    gpus_per_node: int
    tasks_per_node: int | None
    why: str


def look_around(environ: Mapping[str, str] | None = None, slurm: Slurm | None = None) -> Here:
    """This machine, as :func:`choose` needs it (asks ``scontrol`` only where Slurm's clients are)."""
    environ = os.environ if environ is None else environ
    slurm = slurm or Slurm()
    here_slurm = slurm.available()
    name = ""
    if here_slurm:
        try:
            name = slurm.config(timeout_s=5.0).get("ClusterName", "")
        except ClusterError:
            name = ""
    return Here(slurm=here_slurm, slurm_cluster=name, gpus=gpus_here(environ))


def gpus_here(environ: Mapping[str, str], driver_dir: Path = NVIDIA_GPUS) -> int:
    """GPUs this machine shows a job: the driver's, at most as many as ``CUDA_VISIBLE_DEVICES`` names."""
    try:
        count = sum(1 for _ in driver_dir.iterdir())
    except OSError:
        count = 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        named = [one for one in visible.split(",") if one.strip() and not one.strip().startswith("-")]
        count = min(count, len(named))
    return count


def choose(
    here: Here,
    environ: Mapping[str, str],
    *,
    cluster: str | None,
    gpus_per_node: int | None,
    tasks_per_node: int | None,
) -> InitDefaults:
    """The draft's cluster, GPUs and tasks per node: the flags given, the rest from ``here`` (module doc)."""
    why = []
    if cluster is None:
        cluster, reason = _cluster_here(here, environ)
        why.append(f"cluster {cluster}: {reason}")
    try:
        profile = load_profile(cluster)
    except KeyError:
        known = ", ".join(available_profiles())
        raise UsageError(f"--cluster {cluster}: unknown cluster profile", hint=f"use one of: {known}") from None
    local = profile.scheduler == "local"
    if gpus_per_node is None:
        gpus_per_node = here.gpus if local else profile.gpus_per_node
        seen = f"this machine shows {here.gpus}" if local else f"the {cluster} profile's"
        why.append(f"{gpus_per_node} GPUs per node: {seen}")
    elif local and gpus_per_node > here.gpus:
        raise UsageError(
            f"--gpus-per-node {gpus_per_node}: this machine shows {here.gpus} GPU{'s' if here.gpus != 1 else ''}, "
            "and a 'local' job runs here",
            hint=f"use --gpus-per-node {here.gpus} (add --tasks-per-node N for N processes on CPUs), "
            "or name the cluster that has them with --cluster",
        )
    return InitDefaults(cluster, profile, gpus_per_node, tasks_per_node, "; ".join(why))


def _cluster_here(here: Here, environ: Mapping[str, str]) -> tuple[str, str]:
    chosen = environ.get(CLUSTER_VAR, "").strip()
    if chosen:
        return chosen, f"${CLUSTER_VAR}"
    if not here.slurm:
        return "local", "no Slurm here"
    if here.slurm_cluster and here.slurm_cluster in available_profiles():
        return here.slurm_cluster, f"Slurm's ClusterName is {here.slurm_cluster!r}"
    return "slurm", "Slurm is here" + (
        f" (ClusterName {here.slurm_cluster!r} has no profile)" if here.slurm_cluster else ""
    )
