"""A study's status: each point's record from study.json joined with its run's status.

The points' states come from one ``sacct`` call; the run status rule itself
is ``observe/run_status.py``'s. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import read_run_info
from hpctrain.contract.slurm import Slurm
from hpctrain.errors import RunDirError
from hpctrain.launch.study import point_dir, read_study
from hpctrain.observe.run_status import run_status

COLUMNS = ("point", "job", "slurm", "status", "world", "epoch", "step", "img/s", "best top-1")


def study_status(study_dir: Path) -> dict[str, Any]:
    """What ``hpctrain status STUDY --json`` prints: the study's directory, name, and each point's row."""
    record = read_study(study_dir)
    return {"study_dir": str(study_dir), "name": record.get("name"), "points": point_statuses(study_dir)}


def point_statuses(study_dir: Path) -> list[dict[str, Any]]:
    """Each point's record from study.json joined with its run's status (Slurm state, summary).

    The points' states come from one ``sacct`` call (for each run's latest job, which ``resume`` of a
    point changes); a job it does not list yet is asked about alone.
    """
    points = read_study(study_dir)["points"]
    states = Slurm().job_states([job for p in points if p.get("job_id") and (job := _latest_job(study_dir, p))])
    rows = []
    for point in points:
        run_dir = point_dir(study_dir, point)
        try:
            status = run_status(run_dir, states) if point.get("job_id") else {}
        except RunDirError:
            status = {}
        rows.append({**point, **status, "label": point.get("label"), "run_dir": str(run_dir)})
    return rows


def _latest_job(study_dir: Path, point: dict[str, Any]) -> str | None:
    try:
        job_id = read_run_info(point_dir(study_dir, point)).get("job_id")
    except RunDirError:
        return None
    return str(job_id) if job_id else None


def point_cells(row: dict[str, Any]) -> tuple[str, ...]:
    """A point's row as text, one cell per ``COLUMNS``."""
    epochs = row.get("epochs")
    done = row.get("epochs_completed")
    epoch = "-" if done is None else f"{done}/{epochs}" if epochs else str(done)
    return (
        str(row.get("label")),
        str(row.get("job_id") or "-"),
        str(row.get("slurm_state") or "-"),
        str(row.get("status") or "-"),
        str(row.get("world_size") or "-"),
        epoch,
        _text(row.get("global_step")),
        _text(row.get("train_images_per_s"), "{:.1f}"),
        _text(row.get("best_val_top1"), "{:.2f}"),
    )


def _text(value: object, form: str = "{}") -> str:
    return "-" if value is None else form.format(value)
