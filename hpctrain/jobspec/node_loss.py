"""Which specs may heal from a lost node inside their allocation (``resources.min_nodes``, ``spare_nodes``),
and which resumes on other resources keep the run's global batch (:func:`reshape_problem`).

A run that continues on fewer nodes keeps its global batch by sharing its
canonical micro-batches over fewer ranks (``jobspec/shares.py``: any number of
them), which only the elastic strategies can; a spare node keeps the shape, so
any strategy may have spares.
Pure and torch-free: ``validate`` and ``submit`` call it through ``check_resolved``; a
step on fewer nodes (``hpctrain/healing/supervisor.py`` sets :data:`STEP_NODES_VAR`) runs
:func:`step_spec`'s spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from hpctrain.contract import script_env
from hpctrain.errors import DistributedSetupError, SpecProblem
from hpctrain.jobspec.batch import ELASTIC_STRATEGIES, BatchLayout, micro_batch_problem
from hpctrain.jobspec.shares import SharePlan

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec, Resources

# Set by the supervisor on a step that runs on another number of nodes than resources.nodes.
STEP_NODES_VAR = "HPCTRAIN_STEP_NODES"
# Set by the task launcher for the trainer and hpctrain.task: the run's micro-batches per step (elastic resume).
RUN_MICRO_BATCHES_VAR = script_env.RUN_MICRO_BATCHES_VAR


def node_loss_problems(spec: JobSpec) -> list[SpecProblem]:
    """Every reason ``spec``'s min_nodes / spare_nodes cannot work, as spec problems."""
    res = spec.resources
    problems = []
    if res.min_nodes is not None and res.min_nodes > res.nodes:
        message = f"{res.min_nodes} is more than resources.nodes ({res.nodes}); set it to at most {res.nodes}"
        problems.append(SpecProblem("resources.min_nodes", message))
    if res.spare_nodes > res.nodes:
        message = (
            f"{res.spare_nodes} spares for {res.nodes} training node{'s' * (res.nodes != 1)}: the job would hold "
            f"{res.allocated_nodes} nodes, most of them idle; set it to at most {res.nodes} (one spare per node)"
        )
        problems.append(SpecProblem("resources.spare_nodes", message))
    if res.expedited_requeue is True and not spec.requeues:
        message = (
            "true asks Slurm to requeue the job at once after a node failure, but this job is never requeued "
            "(signals.requeue_on_timeout and requeue_on_preemption are false); turn one on, or set it to auto or false"
        )
        problems.append(SpecProblem("resources.expedited_requeue", message))
    if problems or not res.heals:
        return problems
    key = "resources.min_nodes" if res.fewest_nodes < res.nodes else "resources.spare_nodes"
    if spec.sweep:
        problems.append(SpecProblem(key, "a sweep's array tasks cannot heal from a lost node yet; remove it"))
    if res.fewest_nodes < res.nodes and spec.runs_trainer:
        problems += _shrink_problems(spec, res.fewest_nodes)
    return problems


def node_count_text(res: Resources) -> str:
    """The nodes a spec trains on and the nodes it asks Slurm for, as every summary says them
    (``validate``, ``submit --dry-run``, a study's plan): ``4 nodes``, or with healing
    ``4 nodes + 1 spare (5 allocated; continues on as few as 2)``."""
    text = f"{res.nodes} node{'s' * (res.nodes != 1)}"
    if not res.heals:
        return text
    if res.spare_nodes:
        text += f" + {res.spare_nodes} spare{'s' * (res.spare_nodes != 1)}"
    extra = [f"{res.allocated_nodes} allocated"] if res.spare_nodes else []
    if res.fewest_nodes < res.nodes:
        extra.append(f"continues on as few as {res.fewest_nodes} after a lost node")
    return f"{text} ({'; '.join(extra)})"


def _shrink_problems(spec: JobSpec, fewest: int) -> list[SpecProblem]:
    strategy = spec.trainer.strategy
    if strategy not in ELASTIC_STRATEGIES:
        return [
            SpecProblem(
                "resources.min_nodes",
                f"strategy {strategy} cannot continue on fewer nodes (only {', '.join(ELASTIC_STRATEGIES)} can keep "
                f"the global batch); remove min_nodes and use spare_nodes to replace a lost node",
            )
        ]
    gpus_per_task = (spec.resources.gpus_per_node or 0) // spec.tasks_per_node
    full = spec.batch_layout.processes
    fewer = BatchLayout.of(spec.trainer, tasks=fewest * spec.tasks_per_node, gpus_per_task=gpus_per_task).processes
    problem = micro_batch_problem(full, fewer, strategy=strategy)
    return [] if problem is None else [SpecProblem("resources.min_nodes", f"{fewest}: {problem}")]


def fewest_nodes_step_cost(spec: JobSpec) -> float | None:
    """How much longer a step takes on ``min_nodes`` nodes than on ``nodes`` (``SharePlan.step_cost``);
    None when the run never continues on fewer nodes (no min_nodes below nodes, user code, another strategy)."""
    res = spec.resources
    if res.fewest_nodes >= res.nodes or spec.entrypoint is not None or spec.trainer.strategy not in ELASTIC_STRATEGIES:
        return None
    gpus_per_task = (res.gpus_per_node or 0) // spec.tasks_per_node
    fewer = BatchLayout.of(spec.trainer, tasks=res.fewest_nodes * spec.tasks_per_node, gpus_per_task=gpus_per_task)
    full = spec.batch_layout
    return SharePlan(full.processes, fewer.processes, full.per_process).step_cost()


def step_spec(spec: JobSpec, environ: Mapping[str, str]) -> JobSpec:
    """The spec as this step runs it: on :data:`STEP_NODES_VAR` nodes when the supervisor set it."""
    value = environ.get(STEP_NODES_VAR)
    if not value:
        return spec
    res = spec.resources
    if not value.isdigit() or not res.fewest_nodes <= int(value) <= res.nodes:
        raise DistributedSetupError(
            f"{STEP_NODES_VAR}={value!r} is not a node count from resources.min_nodes ({res.fewest_nodes}) "
            f"to resources.nodes ({res.nodes})",
            hint="only hpctrain's supervisor sets it; unset it",
        )
    return spec.model_copy(update={"resources": res.model_copy(update={"nodes": int(value)})})


def reshape_problem(before: JobSpec, after: JobSpec) -> str | None:
    """Why ``after`` (a resume with other resources) cannot keep the global batch of ``before``'s run."""
    old, new = before.batch_layout, after.batch_layout
    if new.per_process != old.per_process:
        return (
            f"resources: each process would load {new.per_process} images per step instead of the run's "
            f"{old.per_process} (trainer.strategy: {after.trainer.strategy} spreads its batch over a task's GPUs)"
        )
    problem = micro_batch_problem(old.processes, new.processes, strategy=after.trainer.strategy)
    if problem is None:
        return None
    per_node = after.tasks_per_node
    most = old.processes // per_node
    works = f"1 to {most}" if after.trainer.strategy in ELASTIC_STRATEGIES and most >= 1 else "none other"
    return f"resources.nodes: {after.resources.nodes}: {problem}; node counts that keep it: {works}"
