"""Resuming (``hpctrain resume``, ``hpctrain.resume``): continue a stopped, cancelled or failed run as a
new job in the same run directory; training resumes from its latest valid checkpoint.

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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpctrain.contract import job_registry, slurm
from hpctrain.contract.rundir import read_run_info, spec_path
from hpctrain.contract.runfiles import check_inside, printable
from hpctrain.contract.slurm import is_final, job_state
from hpctrain.errors import UsageError
from hpctrain.jobspec.batch import reshape_problem
from hpctrain.jobspec.load import LoadedJob, load_job, parse_override
from hpctrain.launch.study import read_study, study_dir_of
from hpctrain.launch.submission import SubmittedRun, resubmit
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
    if not is_final(state):
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


def prepare(run: str | Path, overrides: Sequence[str] = ()) -> tuple[Path, LoadedJob]:
    """The run directory ``run`` names (a run directory or a job id) and the job to resume it with;
    ``UsageError`` for a study, a sweep, an attempt that may still be writing, or a reshape that breaks
    the global batch. Nothing is written."""
    if (study_dir := study_dir_of(run)) is not None:
        refuse_study(study_dir)
    run_dir = job_registry.resolve_run(str(run))
    info = read_run_info(run_dir)
    if info.get("trials"):
        raise UsageError(f"{run_dir} is a sweep", hint=f"resume one trial: hpctrain resume {run_dir}/trial-NNN")
    refuse_while_writing(run_dir, info)
    check_inside(spec_path(run_dir), run_dir)  # the run's own spec, not a file a symlink leads to
    job = load_job(spec_path(run_dir))
    if overrides:
        job = reshaped(run_dir, job, list(overrides))
    return run_dir, job


def start(run_dir: Path, job: LoadedJob, *, local: bool = False) -> SubmittedRun:
    """Submit the next attempt of a run that ``prepare`` accepted (its cancel marker cleared first)."""
    clear_cancel_marker(run_dir)
    return resubmit(run_dir, job, local=local)


def refuse_study(study_dir: Path) -> None:
    """A study is not resumed as a whole: name a point to resume."""
    labels = [printable(p.get("label")) for p in read_study(study_dir)["points"]]
    example = study_dir / str(labels[0]) if labels else study_dir / "POINT"
    raise UsageError(
        f"{study_dir} is a study of {len(labels)} points ({', '.join(map(str, labels))}); each point is its own run",
        hint=f"resume one point's run directory, e.g. hpctrain resume {example}",
    )
