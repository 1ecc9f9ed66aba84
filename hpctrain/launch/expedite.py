"""Whether a submit asks Slurm for expedited requeue: ``resources.expedited_requeue`` against the cluster.

Slurm 25.11 added ``sbatch --requeue=expedite``: after a node failure the job is
requeued at once, eligible to start without the usual hold (``requeue_delay``,
~120 s) and ahead of every other pending job. slurmctld refuses such a job
unless slurm.conf says ``SlurmctldParameters=enable_expedited_requeue``, so the
setting is resolved here, once per submit: ``auto`` uses it where the cluster
takes it, ``true`` refuses to submit where it does not (a message, not
sbatch's "not supported"), ``false`` never uses it. A dry run asks Slurm
nothing: ``auto`` renders plain ``--requeue`` and says the submit decides.
What it means for a run is in docs/preemption.md. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from hpctrain.contract.slurm_answers import ExpeditedRequeue
from hpctrain.errors import UsageError
from hpctrain.jobspec.load import LoadedJob

Support = Callable[[], ExpeditedRequeue]  # asks the cluster (Slurm().expedited_requeue)
KEY = "resources.expedited_requeue"


@dataclass(frozen=True)
class Expedite:
    """``used``: the job is submitted with ``--requeue=expedite``; ``notes``: what the submit says about it."""

    used: bool = False
    notes: tuple[str, ...] = ()


def choose(
    setting: bool | Literal["auto"], requeues: bool, support: ExpeditedRequeue | None, source: str = "the spec"
) -> Expedite:
    """The decision for a job whose spec says ``setting``; ``support``: the cluster's answer, None for a dry
    run (Slurm not asked). Raises UsageError for ``true`` on a cluster without it. Pure."""
    if setting is False or not requeues:  # a job never requeued has nothing to expedite (true: a spec error)
        return Expedite()
    if support is None:
        if setting is True:
            return Expedite(True, ("expedited requeue: on (the submit checks that the cluster takes it)",))
        return Expedite(False, ("expedited requeue: auto, decided at submit (a dry run asks Slurm nothing)",))
    if support.available:
        return Expedite(True, (f"expedited requeue: on ({support.why})",))
    if setting is True:
        raise UsageError(
            f"{source}: {KEY}: true, but this cluster has no expedited requeue: {support.why}",
            hint=f"set {KEY}: auto (use it where the cluster has it) or false; 'hpctrain doctor' says what it has",
        )
    return Expedite(False, (f"expedited requeue: off ({support.why})",))


def expedite_for(job: LoadedJob, *, support: Support | None) -> Expedite:
    """:func:`choose` for ``job``; ``support`` is asked only when the answer depends on it."""
    setting = job.spec.resources.expedited_requeue
    asks = setting is not False and job.spec.requeues and support is not None
    return choose(setting, job.spec.requeues, support() if asks and support else None, str(job.source))
