"""The CLI's side of studies: ``submit``, ``status`` and ``cancel`` of a study directory.

The verbs' own modules call in here when they are given a study (a spec with
``study:``, or a directory holding ``study.json``); the logic of expanding and
recording points is in ``hpctrain/launch/study.py``. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hpctrain.contract import slurm
from hpctrain.contract.rundir import is_study_dir, next_run_dir, read_run_info
from hpctrain.contract.runfiles import for_rich, json_safe, printable
from hpctrain.errors import HpctrainError, RunDirError, UsageError
from hpctrain.jobspec.load import LoadedJob
from hpctrain.launch.study import SubmittedStudy, point_dir, read_study, render_study_plan, submit_study


def study_dir_of(run: str | None) -> Path | None:
    """The study directory ``run`` names, or None when it names something else."""
    if not run:
        return None
    path = Path(run).expanduser()
    return path.resolve() if is_study_dir(path) else None


# ------------------------------------------------------------------ submit


def submit(job: LoadedJob, args: argparse.Namespace) -> int:
    """``hpctrain submit`` of a study spec: every point as its own job (local points one after another)."""
    from hpctrain.cli import cmd_submit

    if args.dry_run:
        print(render_study_plan(job, next_run_dir(job.spec.output_dir, job.spec.name), local=args.local), end="")
        return 0
    if not args.no_preflight:
        cmd_submit.check_before_queueing(job, local=args.local)
    out = sys.stderr if args.json else sys.stdout
    codes: list[int] = []

    def follow(point, submitted) -> None:  # noqa: ANN001 - StudyPoint, SubmittedRun
        if submitted.backend == "local":
            print(f"# study point {point.label} (world size {point.job.spec.world_size})", file=out, flush=True)
            codes.append(cmd_submit.follow_local(submitted, stream=out))
            if codes[-1] >= 128:  # interrupted or terminated: the points after it are not started
                print(f"study stopped at point {point.label}; later points were not started", file=sys.stderr)
                raise SystemExit(codes[-1])

    study = submit_study(job, local=args.local, snapshot=not args.no_snapshot, after_each=follow)
    if args.json:
        print(json.dumps(submission_report(study)), flush=True)
    elif study.runs and study.runs[0][1].backend == "slurm":
        print_submitted(study)
    if codes:
        return max(codes)
    if args.wait:
        return wait_all(study, quiet=args.json)
    return 0


def submission_report(study: SubmittedStudy) -> dict[str, Any]:
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


def print_submitted(study: SubmittedStudy) -> None:
    print(f"submitted study {study.study_dir.name}: {len(study.runs)} jobs")
    for point, submitted in study.runs:
        print(f"  {point.label:<24} job {submitted.job_id:<10} world size {point.job.spec.world_size}")
    print(f"  study dir: {study.study_dir}")
    print(f"  status:    hpctrain status {study.study_dir}")
    print(f"  cancel:    hpctrain cancel {study.study_dir}")


def wait_all(study: SubmittedStudy, *, quiet: bool) -> int:
    from hpctrain.cli.cmd_submit import wait_slurm

    codes = [wait_slurm(submitted, quiet=quiet) for _, submitted in study.runs]
    return max(codes, default=0)


# ------------------------------------------------------------------ status

COLUMNS = ("point", "job", "slurm", "status", "world", "epoch", "step", "img/s", "best top-1")


def point_statuses(study_dir: Path) -> list[dict[str, Any]]:
    """Each point's record from study.json joined with its run's status (Slurm state, summary).

    The points' states come from one ``sacct`` call (for each run's latest job, which ``resume`` of a
    point changes); a job it does not list yet is asked about alone.
    """
    from hpctrain.cli.cmd_status import run_status

    points = read_study(study_dir)["points"]
    states = slurm.job_states([job for p in points if p.get("job_id") and (job := _latest_job(study_dir, p))])
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


def status(study_dir: Path, *, as_json: bool) -> int:
    record = read_study(study_dir)
    rows = point_statuses(study_dir)
    if as_json:
        document = {"study_dir": str(study_dir), "name": record.get("name"), "points": rows}
        print(json.dumps(json_safe(document), allow_nan=False))
        return 0
    table = Table(
        title=for_rich(f"study {record.get('name')} {study_dir} (each point's run dir is STUDY_DIR/POINT)"),
        title_justify="left",
    )
    for column in COLUMNS:
        table.add_column(column)
    for row in rows:
        table.add_row(*(for_rich(cell) for cell in _cells(row)))
    Console(file=sys.stdout, width=200).print(table)
    return 0


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
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


# ------------------------------------------------------------------ cancel and resume


def cancel(study_dir: Path, timeout_s: float) -> int:
    """Cancel every submitted point through the per-run cancel (which waits until nothing is left)."""
    from hpctrain.cli.cmd_cancel import cancel_run

    codes = []
    for point in read_study(study_dir)["points"]:
        if not point.get("job_id"):
            print(f"{printable(point.get('label'))}: never submitted")
            continue
        print(f"{printable(point.get('label'))}:")
        try:
            codes.append(cancel_run(point_dir(study_dir, point), timeout_s))
        except HpctrainError as exc:  # one point's trouble does not keep the others running
            print(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
            codes.append(exc.exit_code)
    return max(codes, default=0)


def refuse_resume(study_dir: Path) -> None:
    labels = [printable(p.get("label")) for p in read_study(study_dir)["points"]]
    example = study_dir / str(labels[0]) if labels else study_dir / "POINT"
    raise UsageError(
        f"{study_dir} is a study of {len(labels)} points ({', '.join(map(str, labels))}); each point is its own run",
        hint=f"resume one point's run directory, e.g. hpctrain resume {example}",
    )
