"""The spec as Slurm sees it: submitit's executor parameters for a resolved spec, and a healing job's supervisor.

``slurm_parameters`` is pure (golden files test what it renders,
``tests/unit/test_launch_submission.py``). It is the one answer to "what would
``sbatch`` be asked": ``launch/submission.py`` submits it (and
``sbatch_script.render_sbatch`` writes it as text for ``--dry-run``), and
``planning/cluster.py`` asks Slurm's ``--test-only`` about the same options.
Torch-free; submitit is not imported.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import slurm_relay_dir
from hpctrain.contract.runfiles import real_path
from hpctrain.contract.slurm_answers import NodeNeeds, plain_features
from hpctrain.errors import UsageError
from hpctrain.jobscript.sbatch_script import signal_parameter, slurm_mem
from hpctrain.jobscript.templates import render_preamble, render_slurm_relay
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.profiles import ClusterProfile
from hpctrain.jobspec.slurm_time import parse_time_limit, seconds_to_minutes

# A task that exits non-zero ends the whole step at once instead of leaving the
# other ranks blocked in a collective until the NCCL/gloo timeout.
SRUN_ARGS = ("--kill-on-bad-exit=1",)


def slurm_parameters(
    spec: JobSpec, profile: ClusterProfile, run_dir: Path, exclude: tuple[str, ...] = (), *, expedite: bool = False
) -> dict[str, Any]:
    """submitit SlurmExecutor parameters for a resolved spec; ``exclude``: nodes for ``--exclude`` (the spec's
    own ``slurm_extra`` exclude among them, ``launch/exclusion.py``); ``expedite``: ``--requeue=expedite``
    for a requeueable job (``resources.expedited_requeue`` as resolved for the cluster,
    ``launch/expedite.py``). Pure."""
    res = spec.resources
    gpus = res.gpus_per_node or 0
    params: dict[str, Any] = {
        "job_name": spec.name,
        "nodes": res.nodes,
        "ntasks_per_node": spec.tasks_per_node,
        "time": seconds_to_minutes(res.time_s),
        "signal_delay_s": spec.signals.signal_delay_s,
        "srun_args": list(SRUN_ARGS),
        "setup": render_preamble(spec.setup, spec.env, str(run_dir)),
        "array_parallelism": res.array_parallelism,
        "wckey": None,  # submitit's default wckey is rejected where TrackWCKey is enforced
        "stderr_to_stdout": False,
    }
    for key in ("partition", "account", "qos", "constraint", "cpus_per_task"):
        if getattr(res, key) is not None:
            params[key] = getattr(res, key)
    if spec.one_task_per_node:
        # One Slurm task per node (torchrun, or a script per node), holding the CPUs of the processes it starts.
        params["ntasks_per_node"] = 1
        if res.cpus_per_task is not None:
            params["cpus_per_task"] = res.cpus_per_task * spec.tasks_per_node
    if res.mem_gb is not None:
        params["mem"] = slurm_mem(res.mem_gb)
    if res.exclusive:
        params["exclusive"] = True
    if gpus and profile.gpu_gres:
        params["gres"] = profile.gpu_gres.format(gpus=gpus)
    elif gpus:
        params["gpus_per_node"] = gpus
    extra: dict[str, Any] = {}
    if not spec.requeues:
        extra["no-requeue"] = True
    else:  # expedite: after a node failure Slurm requeues it at once, at the head of the queue (Slurm 25.11+)
        extra["requeue"] = "expedite" if expedite else True
    # Written from the spec, always: submitit's own line takes its signal from
    # SUBMITIT_PREEMPT_SIGNAL in the submitting shell, which the tasks never see.
    extra["signal"] = signal_parameter(spec.signals.timeout_signal, spec.signals.signal_delay_s)
    if res.heals:  # the batch step supervises its training steps and survives a lost node
        params["nodes"] = res.allocated_nodes
        extra["no-kill"] = True
    if res.time_min is not None:  # backfill may start a shorter chunk in a gap (docs/planning.md)
        extra["time-min"] = seconds_to_minutes(parse_time_limit(res.time_min))
    extra.update(res.slurm_extra)
    if exclude:
        extra["exclude"] = ",".join(exclude)
    params["additional_parameters"] = extra
    if spec.container is not None:
        params["setup"] += render_slurm_relay(str(slurm_relay_dir(run_dir)))
        if spec.container.runtime == "pyxis":
            params["srun_args"] += pyxis_arguments(spec)
    return params


def node_needs(spec: JobSpec) -> NodeNeeds:
    """What one node of the job must offer, as ``slurm_parameters`` asks it: the ``--constraint``'s plain
    features (none for an expression ``plain_features`` does not read), its GPUs, its tasks' CPUs and its
    ``--mem``. A count of nodes that fit (``hpctrain doctor``'s, a requeue's room, a submit trimming the
    bad-node ledger) counts only such nodes. Pure."""
    res = spec.resources
    return NodeNeeds(
        features=plain_features(res.constraint) or (),
        gpus=res.gpus_per_node or 0,
        cpus=spec.tasks_per_node * (res.cpus_per_task or 1),
        mem_mb=res.mem_gb * 1024 if res.mem_gb else 0,
    )


def supervisor_command(spec: JobSpec, run_dir: Path) -> str | None:
    """A healing job's batch-step supervisor, which runs the srun line after it as often as lost nodes
    require (healing/supervisor.py); None for every other job."""
    if not spec.resources.heals:
        return None
    # exec: the batch step's main process, so that SIGTERM (a requeue, scancel) reaches it, not a shell
    # whose default death ends the step at once, before the supervisor has said ExcNodeList;
    # under stop_signals, which counts SIGTERM from its first line (runtime/stop_signals.py)
    python, run = shlex.quote(sys.executable), shlex.quote(str(run_dir))
    return f"exec {python} -m hpctrain.runtime.stop_signals hpctrain.healing.supervisor {run} --"


def container_mounts(spec: JobSpec) -> list[str]:
    """Bind mounts: the spec's, plus output_dir, data.root and the submit directory at their own paths."""
    own = [str(real_path(Path(p).expanduser())) for p in (spec.output_dir, spec.data.root, Path.cwd()) if p]
    for path in own:
        if "," in path or ":" in path:
            raise UsageError(
                f"{path} has a ',' or ':', which container mount lists cannot carry",
                hint="move output_dir / data.root / the submit directory to a path without them",
            )
    mounts = list(spec.container.mounts)
    for path in own:
        if not any(m.split(":")[0] == path for m in mounts):
            mounts.append(path)
    return mounts


def pyxis_arguments(spec: JobSpec) -> list[str]:
    return [
        f"--container-image={spec.container.image}",
        f"--container-mounts={','.join(container_mounts(spec))}",
        f"--container-workdir={real_path(Path.cwd())}",
        *spec.container.options,
    ]
