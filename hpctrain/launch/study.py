"""Studies: the same job at several resource sizes, one Slurm job per point.

A spec with ``study: {resources.nodes: [1, 2, 4]}`` is resolved per point by
``spec/load.py`` (each point has its own world size, global batch and scaled
LR). Here the points become a study directory::

    OUTPUT_DIR/NAME/STUDY_ID/
        study.json          axes, and per point: label, values, run_dir, job_id, size, global batch
        nodes-1/            an ordinary run directory (or a sweep's, with trial-NNN/ inside)
        nodes-2/ ...

``study.json`` (its schema and reader: ``contract/study_file.py``) is written
before the first point is submitted (job ids null) and rewritten atomically
after each submission, so a submit that fails half way leaves a record of what
did reach Slurm. Torch-free: login-node verbs use it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import create_run_dir, study_file
from hpctrain.contract.study_file import STUDY_KIND, STUDY_VERSION, point_dir, write_study
from hpctrain.errors import ClusterError, UsageError
from hpctrain.jobspec.batch import scaled_lr
from hpctrain.jobspec.load import LoadedJob, StudyPoint
from hpctrain.jobspec.node_loss import node_count_text
from hpctrain.launch.submission import SubmittedRun, render_script, submit_run


@dataclass
class SubmittedStudy:
    study_dir: Path
    record: dict[str, Any]
    runs: list[tuple[StudyPoint, SubmittedRun]]


def point_record(point: StudyPoint) -> dict[str, Any]:
    """What ``study.json`` says about one point before it is submitted. Pure."""
    spec = point.job.spec
    record: dict[str, Any] = {
        "label": point.label,
        "values": dict(point.values),
        "run_dir": point.label,
        "job_id": None,
        "nodes": spec.resources.nodes,
        "gpus_per_node": spec.resources.gpus_per_node or 0,
        "tasks_per_node": spec.tasks_per_node,
        "world_size": spec.world_size,
    }
    if spec.runs_trainer:
        record["global_batch"] = spec.global_batch_size
        record["lr"] = scaled_lr(spec.trainer, spec.global_batch_size)
        record["warmup_epochs"] = spec.trainer.warmup_epochs
        record["epochs"] = spec.trainer.epochs
    if point.job.is_sweep:
        record["trials"] = len(point.job.trials)
    return record


def study_record(job: LoadedJob, study_dir: Path, now: datetime.datetime | None = None) -> dict[str, Any]:
    """The whole ``study.json`` of a study about to be submitted. Pure."""
    created = (now or datetime.datetime.now(datetime.timezone.utc)).isoformat(timespec="seconds")
    return {
        "kind": STUDY_KIND,
        "version": STUDY_VERSION,
        "name": job.spec.name,
        "study_id": study_dir.name,
        "created_at": created,
        "cluster": job.profile.name,
        "axes": {key: list(values) for key, values in job.spec.study.items()},
        "points": [point_record(point) for point in job.points],
    }


def describe_point(point: StudyPoint) -> str:
    """One line: size, world, global batch and the LR it gets (what changes between points)."""
    spec = point.job.spec
    gpus = spec.resources.gpus_per_node or 0
    per_node = f"{gpus} GPUs" if gpus else "CPU only"
    line = (
        f"{node_count_text(spec.resources)} x {per_node}, "
        f"{spec.tasks_per_node} task{'s' if spec.tasks_per_node > 1 else ''} per node, world size {spec.world_size}"
    )
    if spec.runs_trainer:
        trainer, layout = spec.trainer, spec.batch_layout
        lr = scaled_lr(trainer, layout.global_batch)
        rule = f"{trainer.lr:g} x {layout.global_batch}/256" if trainer.lr_scaling == "linear" else "not scaled"
        line += f", global batch {layout.global_batch} ({layout.describe()}), lr {lr:.4g} ({rule})"
        if trainer.warmup_epochs:
            line += f", warmup {trainer.warmup_epochs:g} epochs"
    if point.job.is_sweep:
        line += f", sweep of {len(point.job.trials)} trials (one array)"
    return line


def render_study_plan(job: LoadedJob, study_dir: Path, *, local: bool) -> str:
    """What ``submit --dry-run`` prints for a study: per point its size and its sbatch lines. Pure
    over the rendered scripts (the same executor a real submit uses)."""
    out = [f"# study {job.spec.name}: {len(job.points)} points, one job each, under {study_dir}"]
    for index, point in enumerate(job.points, 1):
        out.append("")
        values = ", ".join(f"{key}={value}" for key, value in point.values.items())
        out.append(f"# --- point {index}/{len(job.points)}: {point.label} ({values})")
        out.append(f"# {describe_point(point)}")
        out.append(f"# run dir {study_dir / point.label}")
        if local or point.job.profile.scheduler == "local":
            out.append("# runs on this machine (local executor): no sbatch script")
            continue
        script = render_script(point.job, study_dir / point.label)
        out += [line for line in script.splitlines() if line.startswith(("#SBATCH", "srun "))]
    return "\n".join(out) + "\n"


def submit_study(
    job: LoadedJob,
    *,
    local: bool = False,
    snapshot: bool = True,
    after_each: Callable[[StudyPoint, SubmittedRun], None] | None = None,
) -> SubmittedStudy:
    """Create the study directory and submit every point as its own job, recording each job id.

    ``after_each`` runs after each submission (``--local`` follows the point to its end there,
    so local points run one after another).
    """
    study_dir = create_run_dir(job.spec.output_dir, job.spec.name)
    record = study_record(job, study_dir)
    write_study(study_dir, record)
    runs: list[tuple[StudyPoint, SubmittedRun]] = []
    for point, entry in zip(job.points, record["points"], strict=True):
        try:
            submitted = submit_run(point.job, local=local, run_dir=point_dir(study_dir, entry), snapshot=snapshot)
        except (ClusterError, UsageError) as exc:
            if not runs:
                study_file(study_dir).unlink(missing_ok=True)
                study_dir.rmdir()  # nothing reached Slurm: leave nothing behind, as a plain submit does
                raise
            done = ", ".join(f"{p.label} (job {s.job_id})" for p, s in runs)
            raise (ClusterError if isinstance(exc, ClusterError) else UsageError)(
                f"study point {point.label}: {exc.message}\nalready submitted: {done}",
                hint=f"cancel those with 'hpctrain cancel {study_dir}', or keep them. {exc.hint or ''}".strip(),
            ) from None
        entry["job_id"] = submitted.job_id
        write_study(study_dir, record)
        runs.append((point, submitted))
        if after_each is not None:
            after_each(point, submitted)
    return SubmittedStudy(study_dir, record, runs)
