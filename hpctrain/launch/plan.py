"""What a submission is told before it happens and after: the checks before the queue, warnings
about the spec, and where to follow a submitted run (the dry run itself: ``dry_run.py``).

Both the CLI and the Python API take their text from here. Torch-free, and
light: ``hpctrain validate`` prints its warnings from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.jobspec.lead_time import lead_time_warning

if TYPE_CHECKING:  # the rest is imported where used: 'hpctrain validate' prints warnings from here, and stays light
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.code_snapshot import Snapshot
    from hpctrain.launch.submission import SubmittedRun


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


def code_line(code: Snapshot) -> str:
    """What the code snapshot copied, and what it left out (run.json's ``code_snapshot`` has the list)."""
    line = f"{code.files} files of {', '.join(code.packages)} copied into RUN_DIR/code/"
    if not code.left_out_count:
        return line
    shown = code.left_out[:3] + (["..."] if len(code.left_out) > 3 else [])
    return f"{line}; left out {code.left_out_count}: {'; '.join(shown)}"


def submitted_lines(submitted: SubmittedRun, cluster: str) -> list[str]:
    """Where a submitted run is, and (on Slurm) how to follow, inspect and cancel it."""
    where = "Slurm" if submitted.backend == "slurm" else "this machine (local executor)"
    lines = [f"submitted job {submitted.job_id} to {where}, cluster '{cluster}'", f"  run dir: {submitted.run_dir}"]
    if submitted.code is not None:
        lines.append(f"  code:    {code_line(submitted.code)}")
    if submitted.backend == "slurm":
        lines += [
            f"  follow:  hpctrain logs {submitted.run_dir} --follow",
            f"  status:  hpctrain status {submitted.run_dir}",
            f"  cancel:  hpctrain cancel {submitted.run_dir}",
        ]
    return lines
