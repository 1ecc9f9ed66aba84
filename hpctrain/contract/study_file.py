"""``study.json``: a study's record, its schema and its one reader. Torch-free.

A study (``launch/study.py``: one Slurm job per resource point) lives in
``OUTPUT_DIR/NAME/STUDY_ID/`` with one run directory per point, and
``study.json`` says what belongs to it::

    {"kind": "study", "version": 1, "name": ..., "study_id": ..., "created_at": ..., "cluster": ...,
     "axes": {"resources.nodes": [1, 2, 4]},
     "points": [{"label": "nodes-1", "values": {...}, "run_dir": "nodes-1", "job_id": "48121" | null,
                 "world_size": ..., "nodes": ..., "global_batch_size": ..., ...}, ...]}

``launch/study.py`` writes it before the first point is submitted (job ids
null) and again after each submission; ``status``, ``cancel``, ``resume``,
``report`` and ``submit`` read it here. The file is input like any other in
a shared folder: at most :data:`MAX_POINTS` points, and each point's run
directory a folder inside the study directory. Where it lies is
``contract/rundir.py``'s (:func:`~hpctrain.contract.rundir.study_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import is_study_dir, study_file, write_json_atomic
from hpctrain.contract.runfiles import printable, read_json, real_path
from hpctrain.errors import RunDirError

STUDY_KIND = "study"
STUDY_VERSION = 1
MAX_POINTS = 256  # one Slurm job each; more is a typo or a job for a sweep


def study_dir_of(run: str | Path | None) -> Path | None:
    """The study directory ``run`` names, or None when it names something else (a run, a job id)."""
    if not run:
        return None
    path = Path(run).expanduser()
    return real_path(path) if is_study_dir(path) else None


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
    if not isinstance(record, dict) or record.get("kind") != STUDY_KIND or not isinstance(points, list):
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
        return real_path(Path(study_dir) / relative).is_relative_to(real_path(study_dir))
    except (OSError, RuntimeError, ValueError):
        return False


def point_dir(study_dir: Path, point: dict[str, Any]) -> Path:
    """A point's run directory (``point`` from :func:`read_study`, which confines it to the study)."""
    return Path(study_dir) / point["run_dir"]
