"""Studies: the same job at several resource sizes, one Slurm job per point.

A spec with ``study: {resources.nodes: [1, 2, 4]}`` is resolved per point by
``spec/load.py`` (each point has its own world size, global batch and scaled
LR). Here the points become a study directory::

    OUTPUT_DIR/NAME/STUDY_ID/
        study.json          axes, and per point: label, values, run_dir, job_id, size, global batch
        nodes-1/            an ordinary run directory (or a sweep's, with trial-NNN/ inside)
        nodes-2/ ...

``study.json`` is written before the first point is submitted (job ids null)
and rewritten atomically after each submission, so a submit that fails half
way leaves a record of what did reach Slurm. Torch-free: login-node verbs use it.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import create_run_dir, is_study_dir, study_file, write_json_atomic
from hpctrain.contract.runfiles import printable, read_json
from hpctrain.errors import ClusterError, RunDirError, UsageError
from hpctrain.jobspec.batch import scaled_lr
from hpctrain.jobspec.load import LoadedJob
from hpctrain.jobspec.node_loss import node_count_text
from hpctrain.jobspec.study_axes import MAX_POINTS, StudyPoint
from hpctrain.launch.submission import SubmittedRun, render_script, submit

STUDY_VERSION = 1


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
    if spec.entrypoint is None:
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
        "kind": "study",
        "version": STUDY_VERSION,
        "name": job.spec.name,
        "study_id": study_dir.name,
        "created_at": created,
        "cluster": job.profile.name,
        "axes": {key: list(values) for key, values in job.spec.study.items()},
        "points": [point_record(point) for point in job.points],
    }


def study_dir_of(run: str | Path | None) -> Path | None:
    """The study directory ``run`` names, or None when it names something else (a run, a job id)."""
    if not run:
        return None
    path = Path(run).expanduser()
    return path.resolve() if is_study_dir(path) else None


def submission_report(study: SubmittedStudy) -> dict[str, Any]:
    """What ``submit --json`` prints for a study: its directory and each point's job."""
    return {
        "study_dir": str(study.study_dir),
        "runs": [
            {
                "job_id": submitted.job_id,
                "run_dir": str(submitted.run_dir),
                "label": point.label,
                "world_size": point.job.spec.world_size,
            }
            for point, submitted in study.runs
        ],
    }


def write_study(study_dir: Path, record: dict[str, Any]) -> None:
    write_json_atomic(study_file(study_dir), record)


def read_study(study_dir: Path) -> dict[str, Any]:
    """``study.json`` of ``study_dir``, checked enough to list its points; raises RunDirError.

    The file is input like any other in a shared directory: at most
    :data:`MAX_POINTS` points (what ``submit`` allows), and each point's
    ``run_dir`` a folder inside the study directory, so ``status``, ``report``
    and ``cancel`` of a study never reach ``../../etc`` or ``/``.
    """
    path = study_file(study_dir)
    if not is_study_dir(study_dir):
        raise RunDirError(
            f"{study_dir}: not a study directory (no study.json)",
            hint="pass OUTPUT_DIR/NAME/STUDY_ID as printed by 'hpctrain submit' of a spec with study:",
        )
    try:
        record = read_json(path, within=study_dir)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc})") from None
    points = record.get("points") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("kind") != "study" or not isinstance(points, list):
        raise RunDirError(f"{path}: unreadable or not a study record")
    if len(points) > MAX_POINTS:
        raise RunDirError(
            f"{path}: {len(points)} points, but a study has at most {MAX_POINTS}; not written by hpctrain",
            hint="report, watch or cancel the points' run directories one by one",
        )
    for index, point in enumerate(points, 1):
        if not isinstance(point, dict) or not isinstance(point.get("run_dir"), str):
            raise RunDirError(f"{path}: point {index} has no run_dir")
        if not _inside_study(study_dir, point["run_dir"]):
            raise RunDirError(
                f"{path}: point {index}'s run_dir {printable(point['run_dir'])!r} is not a folder inside the study "
                "directory; not followed",
                hint="each point's run_dir is its label, a folder of the study directory: fix or remove study.json",
            )
    return record


def _inside_study(study_dir: Path, run_dir: str) -> bool:
    """Whether ``run_dir`` names a folder below ``study_dir`` (relative, no '..', and not out through a link)."""
    relative = Path(run_dir)
    if not run_dir or relative.is_absolute() or ".." in relative.parts or relative == Path("."):
        return False
    try:
        return (Path(study_dir) / relative).resolve().is_relative_to(Path(study_dir).resolve())
    except (OSError, RuntimeError, ValueError):
        return False


def point_dir(study_dir: Path, point: dict[str, Any]) -> Path:
    """A point's run directory (``point`` from :func:`read_study`, which confines it to the study)."""
    return Path(study_dir) / point["run_dir"]


def describe_point(point: StudyPoint) -> str:
    """One line: size, world, global batch and the LR it gets (what changes between points)."""
    spec = point.job.spec
    gpus = spec.resources.gpus_per_node or 0
    per_node = f"{gpus} GPUs" if gpus else "CPU only"
    line = (
        f"{node_count_text(spec.resources)} x {per_node}, "
        f"{spec.tasks_per_node} task{'s' if spec.tasks_per_node > 1 else ''} per node, world size {spec.world_size}"
    )
    if spec.entrypoint is None:
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
            submitted = submit(point.job, local=local, run_dir=point_dir(study_dir, entry), snapshot=snapshot)
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
