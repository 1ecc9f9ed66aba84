"""``hpctrain submit SPEC``: validate, then submit to Slurm, or run here with ``--local``.

Thin: the checks before the queue and the warnings are ``hpctrain.launch.plan``,
submitting is ``launch.submission`` (a study's points: ``launch.study``), and
following a local run or waiting for a Slurm job is ``launch.follow``; the
dry run is ``launch.dry_run``.
``--dry-run`` prints the exact sbatch script (rendered by the same executor a
real submit uses) and what each rank will see, and touches neither Slurm nor
the output directory.
"""

from __future__ import annotations

import argparse
import json
import sys

from hpctrain.cli.main import warn
from hpctrain.jobspec.load import LoadedJob, load_job
from hpctrain.launch import plan
from hpctrain.launch.dry_run import dry_run
from hpctrain.launch.submission import submit


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides, cluster=args.cluster)
    warn(plan.spec_warnings(job))
    if job.is_study:
        return submit_study(job, args)
    warn(plan.container_warnings(job, local=args.local))
    if args.dry_run:
        print(
            dry_run(job, local=args.local, snapshot=not args.no_snapshot, exclude_bad_nodes=not args.no_exclude).text,
            end="",
        )
        return 0
    if not args.no_preflight:
        warn(plan.check_before_queueing(job, local=args.local))
    submitted = submit(job, local=args.local, snapshot=not args.no_snapshot, exclude_bad_nodes=not args.no_exclude)
    warn(submitted.notes)
    report = {
        "job_id": submitted.job_id,
        "run_dir": str(submitted.run_dir),
        "cluster": job.profile.name,
        "backend": submitted.backend,
    }
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        print("\n".join(plan.submitted_lines(submitted, job.profile.name)))
    from hpctrain.launch import follow  # here: --dry-run need not load it

    if submitted.backend == "local":
        return follow.follow_local(submitted, stream=sys.stderr if args.json else sys.stdout)
    if args.wait:
        return follow.wait_slurm(submitted, quiet=args.json)
    return 0


def submit_study(job: LoadedJob, args: argparse.Namespace) -> int:
    """A study spec: every point as its own job (local points one after another)."""
    from hpctrain.launch import follow
    from hpctrain.launch.study import submission_report, submit_study

    if args.dry_run:
        print(dry_run(job, local=args.local).text, end="")
        return 0
    if not args.no_preflight:
        warn(plan.check_before_queueing(job, local=args.local))
    out = sys.stderr if args.json else sys.stdout
    codes: list[int] = []

    def follow_point(point, submitted) -> None:  # noqa: ANN001 - StudyPoint, SubmittedRun
        if submitted.backend == "local":
            print(f"# study point {point.label} (world size {point.job.spec.world_size})", file=out, flush=True)
            codes.append(follow.follow_local(submitted, stream=out))
            if codes[-1] >= 128:  # interrupted or terminated: the points after it are not started
                print(f"study stopped at point {point.label}; later points were not started", file=sys.stderr)
                raise SystemExit(codes[-1])

    study = submit_study(job, local=args.local, snapshot=not args.no_snapshot, after_each=follow_point)
    if args.json:
        print(json.dumps(submission_report(study)), flush=True)
    elif study.runs and study.runs[0][1].backend == "slurm":
        print(f"submitted study {study.study_dir.name}: {len(study.runs)} jobs")
        for point, submitted in study.runs:
            print(f"  {point.label:<24} job {submitted.job_id:<10} world size {point.job.spec.world_size}")
        print(f"  study dir: {study.study_dir}")
        print(f"  status:    hpctrain status {study.study_dir}")
        print(f"  cancel:    hpctrain cancel {study.study_dir}")
    if codes:
        return max(codes)
    if args.wait:
        return max((follow.wait_slurm(submitted, quiet=args.json) for _, submitted in study.runs), default=0)
    return 0
