"""``hpctrain submit SPEC``: validate, then submit to Slurm, or run here with ``--local``.

``--dry-run`` prints the exact sbatch script (rendered by the same executor a
real submit uses) and what each rank will see, and touches neither Slurm nor
the output directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hpctrain.cli.cmd_validate import print_warnings
from hpctrain.cli.tail import echo_new
from hpctrain.contract.rundir import Summary, next_run_dir, read_summary
from hpctrain.errors import ClusterError
from hpctrain.jobspec.load import LoadedJob, load_job
from hpctrain.launch.submission import SubmittedRun, backend_for, render_script, submit

TERMINATIONS = (signal.SIGTERM, signal.SIGHUP)
LOCAL_STOP_TIMEOUT_S = 60.0  # as 'hpctrain cancel --timeout': time for the tasks to write their stop checkpoint


def run(args: argparse.Namespace) -> int:
    job = load_job(args.spec, args.overrides, cluster=args.cluster)
    print_warnings(job)
    if job.is_study:
        from hpctrain.cli import study_views

        return study_views.submit(job, args)
    if job.spec.container is not None and backend_for(job, args.local) == "local":
        print(f"warning: {job.source}: container: runs on Slurm only; here the tasks run without the image",
              file=sys.stderr)  # fmt: skip
    if args.dry_run:
        print_dry_run(job, local=args.local, snapshot=not args.no_snapshot)
        return 0
    if not args.no_preflight:
        check_before_queueing(job, local=args.local)
    submitted = submit(job, local=args.local, snapshot=not args.no_snapshot)
    report = {
        "job_id": submitted.job_id,
        "run_dir": str(submitted.run_dir),
        "cluster": job.profile.name,
        "backend": submitted.backend,
    }
    if args.json:
        print(json.dumps(report), flush=True)
    else:
        print_submitted(submitted, job)
    if submitted.backend == "local":
        return follow_local(submitted, stream=sys.stderr if args.json else sys.stdout)
    if args.wait:
        return wait_slurm(submitted, quiet=args.json)
    return 0


def check_before_queueing(job: LoadedJob, *, local: bool) -> None:
    """Refuse what would certainly fail after the queue wait; warn about what might."""
    from hpctrain.contract import slurm
    from hpctrain.diagnose.preflight import raise_for_errors, run_preflight, study_findings

    slurm_backend = backend_for(job, local) == "slurm"
    if slurm_backend and not slurm.available():
        return  # submit() says that this machine cannot submit, which comes first
    if job.is_study:  # every point, each finding once, naming the points it concerns
        findings = study_findings([(p.label, run_preflight(p.job, slurm_backend=slurm_backend)) for p in job.points])
    else:
        findings = run_preflight(job, slurm_backend=slurm_backend)
    for finding in findings:
        if finding.level == "warning":
            print(f"warning: {job.source}: {finding.key}: {finding.message}", file=sys.stderr)
    raise_for_errors(job, findings)


def print_dry_run(job: LoadedJob, *, local: bool, snapshot: bool = True) -> None:
    from hpctrain.runtime.rank_plan import plan_ranks, render_rank_table

    run_dir = next_run_dir(job.spec.output_dir, job.spec.name)
    if backend_for(job, local) == "local":
        print(f"# cluster '{job.profile.name}' runs on this machine through submitit's local executor:")
        print(f"# {job.spec.world_size} task(s), run directory {run_dir}; no sbatch script is used.")
    else:
        print(render_script(job, run_dir), end="")
    print_snapshot_plan(job, snapshot=snapshot)
    print(f"\n# {job.spec.name}: what each rank will see")
    print(render_rank_table(plan_ranks(job.spec), max_rows=64))


def print_snapshot_plan(job: LoadedJob, *, snapshot: bool) -> None:
    """Say which code every attempt will import the entry point from."""
    if job.spec.entrypoint is None:
        return
    from hpctrain.launch import code_snapshot

    source = code_snapshot.locate(job.spec.entrypoint) if snapshot else None
    if source is not None:
        commit, dirty = code_snapshot.git_state(source.git_root) if source.git_root else (None, None)
        where = f" (git {commit[:12]}{', with uncommitted changes' if dirty else ''})" if commit else ""
        print(f"\n# code: {source.files_root}{where} is copied into RUN_DIR/code/ and imported from there")
    elif snapshot and job.spec.entrypoint.startswith("hpctrain."):
        print("\n# code: the entry point is part of hpctrain; every attempt runs the installed hpctrain")
    elif snapshot:
        print(
            f"\n# code: {job.spec.entrypoint} is not copied (not found from here, or part of the Python environment:"
            " site-packages or the standard library); the nodes import it from their environment"
        )
    else:
        print("\n# code: --no-snapshot: every attempt imports the entry point from the live tree")


def print_submitted(submitted: SubmittedRun, job: LoadedJob) -> None:
    where = "Slurm" if submitted.backend == "slurm" else "this machine (local executor)"
    print(f"submitted job {submitted.job_id} to {where}, cluster '{job.profile.name}'")
    print(f"  run dir: {submitted.run_dir}")
    if submitted.backend == "slurm":
        print(f"  follow:  hpctrain logs {submitted.run_dir} --follow")
        print(f"  status:  hpctrain status {submitted.run_dir}")
        print(f"  cancel:  hpctrain cancel {submitted.run_dir}")


def follow_local(submitted: SubmittedRun, stream) -> int:
    """Run a local job in the foreground, echoing rank 0's log; exit with its status.

    SIGTERM or SIGHUP (a closed terminal, ``kill``, a session manager) stops
    the whole run, as ``hpctrain cancel`` would, before this command exits.
    """
    job = submitted.jobs[0]
    log_path = Path(str(job.paths.stdout).replace("%t", "0"))
    offset = 0
    try:
        with _terminations_raise():
            while True:
                done = all(j.done() for j in submitted.jobs)
                offset = echo_new(log_path, offset, stream)
                if done:
                    break
                time.sleep(0.5)
    except KeyboardInterrupt:
        for j in submitted.jobs:
            j.cancel(check=False)
        print(
            f"\ncancelled; the run directory {submitted.run_dir} keeps its last checkpoint "
            f"('hpctrain resume {submitted.run_dir} --local' continues it)",
            file=sys.stderr,
        )
        return 130
    except _Terminated as exc:
        print(f"\n{exc.name}: stopping the run's processes (up to {LOCAL_STOP_TIMEOUT_S:.0f} s)", file=sys.stderr)
        with _terminations_ignored():  # a second SIGTERM must not cut the stop short
            stop_local(submitted, LOCAL_STOP_TIMEOUT_S)
        print(
            f"stopped; the run directory {submitted.run_dir} keeps its last checkpoint "
            f"('hpctrain resume {submitted.run_dir} --local' continues it)",
            file=sys.stderr,
        )
        return 128 + exc.signum
    failures = [j for j in submitted.jobs if j.exception() is not None]
    summary = read_summary(submitted.trial_dirs[0]) or Summary()
    if failures:
        error = str(failures[0].exception()).strip().splitlines()
        tail = "\n".join(error[-8:])
        raise ClusterError(f"local job failed:\n{tail}", hint=f"full logs: hpctrain logs {submitted.run_dir} --err")
    status = summary.status or "completed"
    line = f"finished: status {status}"
    for key in ("epochs_completed", "val_top1", "val_top5", "wall_s"):
        value = getattr(summary, key)
        if value is not None:
            line += f", {key} {value:.2f}" if isinstance(value, float) else f", {key} {value}"
    print(line, file=stream)
    print(f"run dir: {submitted.run_dir}", file=stream)
    return 0 if status in ("completed", "running") else 1


def stop_local(submitted: SubmittedRun, timeout_s: float) -> None:
    """Cancel a local submission from inside: cancel markers first (the tasks then save and stop rather
    than take the SIGTERM for a preemption), then every controller and whatever carries its run token."""
    from hpctrain.runtime import local_run
    from hpctrain.runtime.stop import write_cancel_marker

    records = [r for j in submitted.jobs if (r := getattr(j, "local_process", None)) is not None]
    for one_dir, one in zip(submitted.trial_dirs, submitted.jobs):
        write_cancel_marker(one_dir, [one.job_id])
    local_run.stop(records, timeout_s)


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _terminations_raise() -> contextlib.AbstractContextManager[None]:
    """SIGTERM and SIGHUP raise :class:`_Terminated` in the main thread (the first one: the next ones
    are ignored until the block is left); the previous handlers are back afterwards."""

    def handler(signum: int, _frame: object) -> None:
        for one in TERMINATIONS:
            signal.signal(one, signal.SIG_IGN)
        raise _Terminated(signum)

    return _handling(TERMINATIONS, handler)


def _terminations_ignored() -> contextlib.AbstractContextManager[None]:
    return _handling(TERMINATIONS, signal.SIG_IGN)


@contextlib.contextmanager
def _handling(signums: tuple[signal.Signals, ...], handler: object) -> Iterator[None]:
    previous = {one: signal.signal(one, handler) for one in signums}  # type: ignore[arg-type]
    try:
        yield
    finally:
        for one, old in previous.items():
            signal.signal(one, old)


def wait_slurm(submitted: SubmittedRun, *, quiet: bool) -> int:
    from hpctrain.contract.slurm import wait_until_done

    state = wait_until_done(submitted.job_id)
    if not quiet:
        print(f"job {submitted.job_id} ended: {state}")
    if state != "COMPLETED":
        print(
            f"error: job {submitted.job_id} ended {state}; see hpctrain logs {submitted.run_dir} --err", file=sys.stderr
        )
        return 1
    return 0
