"""Resuming (``hpctrain resume``, ``hpctrain.resume``): continue a stopped, cancelled or failed run as a
new job in the same run directory; training resumes from its latest valid checkpoint.

Two attempts must never write one run directory at once. So resume refuses
while the previous attempt may still be writing: its Slurm job has not
ended, or it has ended but Slurm still has processes of it (COMPLETING: the
ranks are saving the stop checkpoint, at most KillWait long; resume waits
for that, up to :data:`STOPPING_WAIT_S`, then refuses); for a local
run, while its submitit controller is alive. Slurm's own view of the job's
processes is the lock: it needs no file that a killed attempt could leave
behind, and no lock that a shared file system may not honour across nodes.

``--set resources.nodes=K`` resumes on another shape; the trainer keeps the run's global batch
(docs/preemption.md), so only shapes that can split it are accepted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpctrain.contract import job_registry
from hpctrain.contract.cancel_marker import clear_cancel_marker
from hpctrain.contract.chain_links import clear_chain_end
from hpctrain.contract.rundir import read_run_info, spec_path
from hpctrain.contract.runfiles import check_inside, printable
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.study_file import read_study, study_dir_of
from hpctrain.errors import UsageError
from hpctrain.jobspec.load import LoadedJob, load_job, parse_override
from hpctrain.jobspec.node_loss import reshape_problem
from hpctrain.launch import plan
from hpctrain.launch.cancel import run_activity
from hpctrain.launch.submission import SubmittedRun, resubmit
from hpctrain.launch.submit import Steps, Submission, finish, forecast_of

STOPPING_WAIT_S = 60.0  # a Slurm job that ended while its tasks stop (COMPLETING): KillWait (30 s by default) and more
STOPPING_POLL_S = 1.0


def refuse_while_writing(
    run_dir: Path,
    info: dict[str, Any],
    *,
    slurm: Slurm | None = None,
    wait_s: float = STOPPING_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Raise UsageError while the run's previous attempt may still write into ``run_dir`` (the question
    ``hpctrain cancel`` asks too: ``launch/cancel.py``'s :func:`~hpctrain.launch.cancel.run_activity`).

    A Slurm job that has ended while Slurm still has processes of it (its tasks stopping, COMPLETING) is
    waited for, up to ``wait_s``: a resume typed right after a job failed or was cancelled goes ahead as
    soon as Slurm says the tasks are gone (seconds), instead of asking the user to try again."""
    slurm = slurm or Slurm()
    activity = run_activity(run_dir, info, slurm)
    deadline = clock() + wait_s
    while activity.state == "stopping" and info.get("backend") != "local" and clock() < deadline:
        sleep(STOPPING_POLL_S)
        activity = run_activity(run_dir, info, slurm)
    if activity.state == "running" and info.get("backend") != "local":
        hint = f"it resumes by itself; cancel it first with 'hpctrain cancel {run_dir}'"
    elif activity.state in ("running", "stopping") and info.get("backend") == "local":
        hint = f"wait for it, or stop it first with 'hpctrain cancel {run_dir}'"
    elif activity.state == "stopping":  # still, after wait_s
        hint = f"its tasks did not stop within {wait_s:.0f} s; 'hpctrain cancel {run_dir}' ends them, then resume"
    else:
        return  # ended; or unknown: submitted from elsewhere, and resubmitting needs Slurm, which will say so
    raise UsageError(activity.why, hint=hint)


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


def prepare(run: str | Path, overrides: Sequence[str] = (), *, slurm: Slurm | None = None) -> tuple[Path, LoadedJob]:
    """The run directory ``run`` names (a run directory or a job id) and the job to resume it with;
    ``UsageError`` for a study, a sweep, an attempt that may still be writing, or a reshape that breaks
    the global batch. Nothing is written."""
    if (study_dir := study_dir_of(run)) is not None:
        refuse_study(study_dir)
    run_dir = job_registry.resolve_run(str(run))
    info = read_run_info(run_dir)
    if info.get("trials"):
        raise UsageError(f"{run_dir} is a sweep", hint=f"resume one trial: hpctrain resume {run_dir}/trial-NNN")
    refuse_while_writing(run_dir, info, slurm=slurm)
    check_inside(spec_path(run_dir), run_dir)  # the run's own spec, not a file a symlink leads to
    job = load_job(spec_path(run_dir))
    if overrides:
        job = reshaped(run_dir, job, list(overrides))
    return run_dir, job


def start(run_dir: Path, job: LoadedJob, *, local: bool = False, slurm: Slurm | None = None) -> SubmittedRun:
    """Submit the next attempt of a run that ``prepare`` accepted (its cancel marker cleared first). A chained
    run waits for its upstream's current job; the run's own dependents are re-pointed to the new job, and
    those its chain ended are submitted again (``launch/chain.py``)."""
    from hpctrain.launch import chain

    if job.spec.after is not None:
        job = chain.linked(job, local=local, slurm=slurm)
    clear_cancel_marker(run_dir)
    clear_chain_end(run_dir)
    submitted = resubmit(run_dir, job, local=local)
    if submitted.backend == "slurm":

        def again(dependent: Path) -> object:
            return start(dependent, load_job(spec_path(dependent)), slurm=slurm)

        submitted.notes = (*submitted.notes, *chain.repoint(run_dir, submitted.job_id, again, slurm=slurm or Slurm()))
    return submitted


def resume(
    run: str | Path,
    overrides: Sequence[str] = (),
    *,
    local: bool = False,
    wait: bool = False,
    follow_local: bool = False,
    steps: Steps | None = None,
    slurm: Slurm | None = None,
) -> Submission:
    """The resume verb's one sequence (``hpctrain resume``, ``hpctrain.resume``): refuse what must not
    resume, warn (with the save times measured in this run's checkpoints), submit the next attempt,
    then follow or wait for it as ``submit`` does (``launch/submit.py``)."""
    steps = steps or Steps()
    run_dir, job = prepare(run, overrides, slurm=slurm)
    warnings = plan.spec_warnings(job, run_dir)
    steps.warned(warnings)
    submitted = start(run_dir, job, local=local, slurm=slurm)
    steps.warned(submitted.notes)  # the bad-node ledger's exclusions
    made = forecast_of(job, submitted, slurm, by="resume", steps_done=_steps_done(run_dir))
    one = Submission(submitted.run_dir, submitted.job_id, submitted.backend, warnings=(*warnings, *submitted.notes),
                     cluster=job.profile.name, world_size=job.spec.world_size, forecast=made)  # fmt: skip
    steps.submitted(one)
    follow = wait or (follow_local and submitted.backend == "local")
    return finish(one, submitted, wait=follow, steps=steps, slurm=slurm)


def _steps_done(run_dir: Path) -> int:
    """The steps the run kept (its latest checkpoint's, else the summary's): a resume trains the rest."""
    from hpctrain.contract.summary import read_summary

    summary = read_summary(run_dir)
    return summary.global_step or 0 if summary is not None else 0


def refuse_study(study_dir: Path) -> None:
    """A study is not resumed as a whole: name a point to resume."""
    labels = [printable(p.get("label")) for p in read_study(study_dir)["points"]]
    example = study_dir / str(labels[0]) if labels else study_dir / "POINT"
    raise UsageError(
        f"{study_dir} is a study of {len(labels)} points ({', '.join(map(str, labels))}); each point is its own run",
        hint=f"resume one point's run directory, e.g. hpctrain resume {example}",
    )
