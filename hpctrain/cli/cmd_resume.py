"""``hpctrain resume RUN``: continue a stopped, cancelled or failed run as a new
job in the same run directory; training resumes from its latest valid checkpoint.

Two attempts must never write one run directory at once. So resume refuses
while the previous attempt may still be writing: its Slurm job has not
ended, or it has ended but Slurm still has processes of it (COMPLETING: the
ranks are saving the stop checkpoint, at most KillWait long); for a local
run, while its submitit controller is alive. Slurm's own view of the job's
processes is the lock: it needs no file that a killed attempt could leave
behind, and no lock that a shared file system may not honour across nodes.

``--set resources.nodes=K`` resumes on another shape; the trainer keeps the run's global batch
(docs/preemption.md), so only shapes that can split it are accepted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hpctrain.cli.cmd_submit import follow_local, print_submitted, wait_slurm
from hpctrain.cli.cmd_validate import print_warnings
from hpctrain.contract import job_registry, slurm
from hpctrain.contract.rundir import read_run_info, spec_path
from hpctrain.contract.slurm import TERMINAL_STATES, job_state
from hpctrain.errors import UsageError
from hpctrain.jobspec.batch import reshape_problem
from hpctrain.jobspec.load import LoadedJob, load_job, parse_override
from hpctrain.launch.submission import resubmit
from hpctrain.runtime import local_run
from hpctrain.runtime.stop import clear_cancel_marker


def refuse_while_writing(run_dir: Path, info: dict[str, Any]) -> None:
    """Raise UsageError while the run's previous attempt may still write into ``run_dir``."""
    job_id = str(info.get("job_id", ""))
    if info.get("backend") == "local":
        if local_run.liveness(info) != "gone":  # proven to run, or a live PID nothing proves is another's
            raise UsageError(
                f"the previous local attempt of this run (pid {job_id}) may still be running",
                hint=f"wait for it, or stop it first with 'hpctrain cancel {run_dir}'",
            )
        return
    if not job_id or not slurm.available():
        return  # submitted from elsewhere; resubmitting needs Slurm, which will say so
    state = job_state(job_id)
    if state not in TERMINAL_STATES:
        raise UsageError(
            f"job {job_id} of this run is still {state}",
            hint=f"it resumes by itself; cancel it first with 'hpctrain cancel {run_dir}'",
        )
    if slurm.processes_may_run(job_id):
        raise UsageError(
            f"job {job_id} of this run ended ({state}), but its tasks are still stopping and may be writing "
            "the stop checkpoint",
            hint=f"try again in a few seconds ('hpctrain cancel {run_dir}' waits for this by itself)",
        )


def reshaped(run_dir: Path, job: LoadedJob, overrides: list[str]) -> LoadedJob:
    """The run's job on other resources (``--set resources.KEY=VALUE``), refused unless it keeps the global batch."""
    for text in overrides:
        if not parse_override(text)[0].startswith("resources."):
            raise UsageError(
                f"--set {text}: resume changes only resources.* keys; the rest of a run's spec is fixed",
                hint="start a new run with 'hpctrain submit' to change anything else",
            )
    after = load_job(spec_path(run_dir), overrides)
    problem = reshape_problem(job.spec, after.spec)
    if problem is not None:
        raise UsageError(problem, hint=f"choose another resources.nodes, or resume {run_dir} on its own shape")
    return after


def run(args: argparse.Namespace) -> int:
    from hpctrain.cli import study_views

    if (study_dir := study_views.study_dir_of(args.run)) is not None:
        study_views.refuse_resume(study_dir)
    run_dir = job_registry.resolve_run(args.run)
    info = read_run_info(run_dir)
    if info.get("trials"):
        raise UsageError(f"{run_dir} is a sweep", hint=f"resume one trial: hpctrain resume {run_dir}/trial-NNN")
    refuse_while_writing(run_dir, info)
    job = load_job(spec_path(run_dir))
    if args.overrides:
        job = reshaped(run_dir, job, args.overrides)
    print_warnings(job, run_dir)  # measured save times from this run's own checkpoints
    clear_cancel_marker(run_dir)
    submitted = resubmit(run_dir, job, local=args.local)
    if args.json:
        print(json.dumps({"job_id": submitted.job_id, "run_dir": str(run_dir), "cluster": submitted.backend}))
    else:
        print_submitted(submitted, job)
    if submitted.backend == "local":
        return follow_local(submitted, stream=sys.stderr if args.json else sys.stdout)
    return wait_slurm(submitted, quiet=args.json) if args.wait else 0
