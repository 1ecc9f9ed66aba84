"""Which specs may use the node-health features (``health:``): burn-in and slow-node eviction. Pure, torch-free.

The variables between the supervisor and the burn-in are here too, torch-free
(``healing/supervisor.py`` sets them, ``healing/burn_in.py`` reads them).
``validate`` and ``submit`` call :func:`node_health_problems` through
``check_resolved``; the ranges of each key are the models' (``jobspec/models.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.errors import SpecProblem

# Set by the supervisor on each training step it starts: JOB.RESTART.ATTEMPT (the burn-in records it).
STEP_ID_VAR = "HPCTRAIN_STEP_ID"
# Set to "off" by the supervisor after it kept a node the burn-in flagged: the next steps train without one;
# and by a torchrun node task for its ranks: the node tasks ran this start's burn-in before torchrun.
BURN_IN_VAR = "HPCTRAIN_BURN_IN"
# Every rank's exit status when the burn-in flagged nodes and the supervisor must decide.
BURN_IN_EXIT = 75

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec


def node_health_problems(spec: JobSpec) -> list[SpecProblem]:
    """Every reason ``spec``'s health section cannot work, as spec problems."""
    problems = []
    health, res = spec.health, spec.resources
    if health.eviction.enabled is True and not res.heals:
        problems.append(
            SpecProblem(
                "health.eviction.enabled",
                "true, but the job has no node to spare: an evicted node is replaced by a spare or dropped, so set "
                "resources.spare_nodes: 1, or resources.min_nodes below resources.nodes (a job without either "
                "would have to requeue and wait in the queue again); or set it to auto",
            )
        )
    if health.burn_in.enabled and res.nodes > 1 and health.burn_in.budget_s >= res.time_s / 2:
        problems.append(
            SpecProblem(
                "health.burn_in.budget_s",
                f"{health.burn_in.budget_s:g} s is half the time limit ({res.time}) or more: every start runs the "
                "burn-in; lower it or raise resources.time",
            )
        )
    return problems


def burn_in_applies(spec: JobSpec, step_nodes: int) -> bool:
    """Whether a training step on ``step_nodes`` nodes starts with the burn-in: on, several nodes. Under srun
    the ranks (a script's wrapper tasks) run it; under ``launcher: torchrun`` the node tasks, before torchrun."""
    return spec.health.burn_in.enabled and step_nodes > 1
