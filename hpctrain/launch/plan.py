"""What a submission will do, said before it happens and after: the dry run, the checks before the
queue, warnings about the spec, and where to follow a submitted run.

``--dry-run`` text is rendered by the same executor parameters a real submit
uses (``submission.render_script``), so what it prints is what Slurm gets.
Both the CLI and the Python API take their text from here. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.jobspec.lead_time import lead_time_warning

if TYPE_CHECKING:  # the rest is imported where used: 'hpctrain validate' prints warnings from here, and stays light
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.submission import SubmittedRun


@dataclass(frozen=True)
class DryRun:
    """What ``submit`` would do, touching neither Slurm nor the output directory.

    ``script``: the exact sbatch script (None when the job runs on this machine, or for a
    study, whose points each get their own); ``text``: all that ``hpctrain submit --dry-run``
    prints (the script, the code snapshot plan and each rank's view, or a study's plan).
    """

    run_dir: Path
    script: str | None
    text: str


def dry_run(job: LoadedJob, *, local: bool = False, snapshot: bool = True) -> DryRun:
    from hpctrain.contract.rundir import next_run_dir
    from hpctrain.launch.submission import backend_for, render_script

    run_dir = next_run_dir(job.spec.output_dir, job.spec.name)
    if job.is_study:
        from hpctrain.launch.study import render_study_plan

        return DryRun(run_dir, None, render_study_plan(job, run_dir, local=local))
    from hpctrain.runtime.rank_plan import plan_ranks, render_rank_table

    if backend_for(job, local) == "local":
        script = None
        text = (
            f"# cluster '{job.profile.name}' runs on this machine through submitit's local executor:\n"
            f"# {job.spec.world_size} task(s), run directory {run_dir}; no sbatch script is used.\n"
        )
    else:
        script = text = render_script(job, run_dir)
    for line in snapshot_plan(job, snapshot=snapshot):
        text += f"\n{line}\n"
    text += f"\n# {job.spec.name}: what each rank will see\n"
    text += render_rank_table(plan_ranks(job.spec), max_rows=64) + "\n"
    return DryRun(run_dir, script, text)


def snapshot_plan(job: LoadedJob, *, snapshot: bool) -> list[str]:
    """Which code every attempt will import the entry point from (nothing without an entry point)."""
    if job.spec.entrypoint is None:
        return []
    from hpctrain.launch import code_snapshot

    source = code_snapshot.locate(job.spec.entrypoint) if snapshot else None
    if source is not None:
        commit, dirty = code_snapshot.git_state(source.git_root) if source.git_root else (None, None)
        where = f" (git {commit[:12]}{', with uncommitted changes' if dirty else ''})" if commit else ""
        return [f"# code: {source.files_root}{where} is copied into RUN_DIR/code/ and imported from there"]
    if snapshot and job.spec.entrypoint.startswith("hpctrain."):
        return ["# code: the entry point is part of hpctrain; every attempt runs the installed hpctrain"]
    if snapshot:
        return [
            f"# code: {job.spec.entrypoint} is not copied (not found from here, or part of the Python environment:"
            " site-packages or the standard library); the nodes import it from their environment"
        ]
    return ["# code: --no-snapshot: every attempt imports the entry point from the live tree"]


def check_before_queueing(job: LoadedJob, *, local: bool) -> list[str]:
    """Refuse (``SpecError``) what would certainly fail after the queue wait; the warnings about what might."""
    from hpctrain.contract import slurm
    from hpctrain.diagnose.preflight import raise_for_errors, run_preflight, study_findings
    from hpctrain.launch.submission import backend_for

    slurm_backend = backend_for(job, local) == "slurm"
    if slurm_backend and not slurm.available():
        return []  # submit() says that this machine cannot submit, which comes first
    if job.is_study:  # every point, each finding once, naming the points it concerns
        findings = study_findings([(p.label, run_preflight(p.job, slurm_backend=slurm_backend)) for p in job.points])
    else:
        findings = run_preflight(job, slurm_backend=slurm_backend)
    warnings = [f"{job.source}: {f.key}: {f.message}" for f in findings if f.level == "warning"]
    raise_for_errors(job, findings)
    return warnings


def spec_warnings(job: LoadedJob, run_dir: Path | None = None) -> list[str]:
    """Things that are allowed but likely to hurt (never fatal): a checkpoint that may not be saved
    before the time limit (``run_dir``: with the save times measured in that run's checkpoints)."""
    for spec in job.trials:
        warning = lead_time_warning(spec, run_dir)
        if warning:
            return [f"{job.source}: {warning}"]
    return []


def container_warnings(job: LoadedJob, *, local: bool) -> list[str]:
    """A ``container:`` job run on this machine runs without its image: say so."""
    from hpctrain.launch.submission import backend_for

    if job.spec.container is None or backend_for(job, local) != "local":
        return []
    return [f"{job.source}: container: runs on Slurm only; here the tasks run without the image"]


def submitted_lines(submitted: SubmittedRun, cluster: str) -> list[str]:
    """Where a submitted run is, and (on Slurm) how to follow, inspect and cancel it."""
    where = "Slurm" if submitted.backend == "slurm" else "this machine (local executor)"
    lines = [f"submitted job {submitted.job_id} to {where}, cluster '{cluster}'", f"  run dir: {submitted.run_dir}"]
    if submitted.backend == "slurm":
        lines += [
            f"  follow:  hpctrain logs {submitted.run_dir} --follow",
            f"  status:  hpctrain status {submitted.run_dir}",
            f"  cancel:  hpctrain cancel {submitted.run_dir}",
        ]
    return lines
