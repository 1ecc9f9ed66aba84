"""The status verb's one sequence (``hpctrain status RUN|STUDY``, ``hpctrain.status``): one run, or a study.

One run: its status by the one rule (``observe/run_status.py``) with each
rank's last heartbeat, as :class:`~hpctrain.observe.run_status.RunStatus`. A
study: each point's record from study.json joined with its run's status, the
points' states from one ``sacct`` call, as :class:`StudyStatus`. Both faces
call :func:`status`; the CLI prints what it returns (``--json``: ``as_dict()``),
the Python API returns it. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import read_run_info
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.study_file import point_dir, read_study
from hpctrain.errors import RunDirError
from hpctrain.observe.run_status import RunStatus, run_status, status_with_ranks

COLUMNS = ("point", "job", "slurm", "status", "world", "epoch", "step", "img/s", "best top-1")


@dataclass(frozen=True)
class StudyStatus:
    """A study's status: what ``hpctrain status STUDY --json`` prints; ``points``: one row per point
    (its record from study.json joined with its run's status)."""

    study_dir: str
    name: str | None
    points: tuple[dict[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"study_dir": self.study_dir, "name": self.name, "points": list(self.points)}


def status(target: str | Path, *, slurm: Slurm | None = None) -> RunStatus | StudyStatus:
    """The status of ``target``: a study directory (:class:`StudyStatus`), or a run directory or job id
    (:class:`RunStatus`, with its ranks' heartbeats)."""
    from hpctrain.contract.job_registry import resolve_run
    from hpctrain.contract.study_file import study_dir_of

    if (study_dir := study_dir_of(target)) is not None:
        document = study_status(study_dir, slurm=slurm)
        return StudyStatus(document["study_dir"], document["name"], tuple(document["points"]))
    from hpctrain.observe.chain_view import chain_rows

    run_dir = resolve_run(str(target))
    facts, ranks = status_with_ranks(run_dir, slurm=slurm)
    return replace(RunStatus(**facts, chain=chain_rows(run_dir, slurm=slurm)), ranks=ranks)


def study_status(study_dir: Path, *, slurm: Slurm | None = None) -> dict[str, Any]:
    """What ``hpctrain status STUDY --json`` prints: the study's directory, name, and each point's row."""
    record = read_study(study_dir)
    return {"study_dir": str(study_dir), "name": record.get("name"), "points": point_statuses(study_dir, slurm=slurm)}


def point_statuses(study_dir: Path, *, slurm: Slurm | None = None) -> list[dict[str, Any]]:
    """Each point's record from study.json joined with its run's status (Slurm state, summary).

    The points' states come from one ``sacct`` call (for each run's latest job, which ``resume`` of a
    point changes); a job it does not list yet is asked about alone.
    """
    points = read_study(study_dir)["points"]
    slurm = slurm or Slurm()
    states = slurm.job_states([job for p in points if p.get("job_id") and (job := _latest_job(study_dir, p))])
    rows = []
    for point in points:
        run_dir = point_dir(study_dir, point)
        try:
            status = run_status(run_dir, states, slurm=slurm) if point.get("job_id") else {}
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
