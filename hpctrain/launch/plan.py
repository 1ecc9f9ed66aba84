"""What a submission is told before it happens and after: the validate verb's sequence, the checks
before the queue, warnings about the spec, and where to follow a submitted run (the dry run itself:
``dry_run.py``).

Both the CLI and the Python API take their text from here. Torch-free, and
light: ``hpctrain validate`` runs from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.jobspec.lead_time import lead_time_warning
from hpctrain.jobspec.slurm_time import parse_time_limit

if TYPE_CHECKING:  # the rest is imported where used: 'hpctrain validate' runs from here, and stays light
    from hpctrain.contract.slurm import Slurm
    from hpctrain.diagnose.findings import Finding
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.code_snapshot import Snapshot


@dataclass(frozen=True)
class Validation:
    """A spec that passed: the job, its one-line ``summary``, one line per study point (``points``),
    and the ``warnings`` (allowed, but likely to hurt)."""

    job: LoadedJob
    summary: str
    points: tuple[str, ...]
    warnings: tuple[str, ...]


def limit_words(seconds: int) -> str:
    """A time limit in words, so ``time: 90`` (minutes, to Slurm) is not read as hours: ``1 h 30 min``."""
    parts = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
    words, left = [], seconds
    for unit, size in parts:
        if left >= size:
            words.append(f"{left // size} {unit}")
            left %= size
    return " ".join(words) or "0 s"


def validate(path: str | Path, overrides: Sequence[str] = (), *, cluster: str | None = None) -> Validation:
    """The validate verb's one sequence (``hpctrain validate``, ``hpctrain.load_job``): read and check the
    spec, read (never mount) a packed image named by data.root, and read (never import) an entry point's
    source. ``SpecError`` lists every problem."""
    from hpctrain.errors import SpecError, SpecProblem
    from hpctrain.jobspec.load import load_job

    job = load_job(path, overrides, cluster=cluster, check_program=True)  # with every other problem at once
    findings = file_findings(job)
    errors = [f for f in findings if f.level == "error"]
    if errors:
        raise SpecError(str(job.source), [SpecProblem(f.key, f.message) for f in errors])
    points: tuple[str, ...] = ()
    if job.is_study:
        from hpctrain.launch.study import describe_point

        points = tuple(f"{point.label}: {describe_point(point)}" for point in job.points)
    warnings = spec_warnings(job) + [f"{job.source}: {f.key}: {f.message}" for f in findings]
    return Validation(job, describe(job), points, tuple(warnings))


def describe(job: LoadedJob) -> str:
    """One line: where, how big, how much per step."""
    from hpctrain.jobspec.node_loss import fewest_nodes_step_cost, node_count_text

    spec = job.spec
    gpus = spec.resources.gpus_per_node or 0
    per_node = f"{gpus} GPUs" if gpus else f"{spec.tasks_per_node} CPU task{'s' if spec.tasks_per_node > 1 else ''}"
    what = (
        spec.entrypoint
        or (spec.script and f"script {spec.script.program} (one process per {spec.script.per})")
        or f"{spec.trainer.arch} {spec.trainer.strategy} {spec.trainer.precision}"
    )
    line = (
        f"{spec.name} on {job.profile.name}: {node_count_text(spec.resources)} "
        f"x {per_node}, world size {spec.world_size}, "
    )
    if spec.runs_trainer:
        layout = spec.batch_layout
        line += f"global batch {layout.global_batch} ({layout.describe()}), "
    line += f"{what}, time {spec.resources.time} ({limit_words(parse_time_limit(spec.resources.time))})"
    cost = fewest_nodes_step_cost(spec)
    if cost is not None:  # e.g. 16 -> 15 nodes of 4 GPUs: 1.09x, the ideal 1.07x
        fewest = spec.resources.fewest_nodes
        line += f"; a step on {fewest} node{'s' * (fewest > 1)} takes {cost:.2f}x"
    if job.is_sweep:
        line += f", sweep of {len(job.trials)} trials"
    if job.is_study:
        line += f"; study of {len(job.points)} points, one job each"
    return line


def file_findings(job: LoadedJob) -> list[Finding]:
    """What the files behind the spec say, read on this machine and never run: a data.root that names an
    image file (read, never mounted), and an entry point whose source cannot take ``ctx`` (read with
    ``ast``, never imported). Either fails here, not in the job."""
    images = [spec for spec in job.trials if spec.runs_trainer and _names_file(spec.data.root)]
    entrypoints = [spec for spec in job.trials if spec.entrypoint is not None]
    if not images and not entrypoints:
        return []  # nothing to read: the common case does not load the checks
    from hpctrain.diagnose.preflight import check_data_root, check_entrypoint

    findings: list[Finding] = []
    for found in [*map(check_data_root, images), *map(check_entrypoint, entrypoints)]:
        findings += [f for f in found if f not in findings]
    return findings


def _names_file(root: str | None) -> bool:
    return bool(root) and Path(root).expanduser().is_file()


def check_before_queueing(job: LoadedJob, *, local: bool, slurm: Slurm | None = None) -> list[str]:
    """Refuse (``SpecError``) what would certainly fail after the queue wait; the warnings about what might."""
    from hpctrain.contract.slurm import Slurm
    from hpctrain.diagnose.preflight import raise_for_errors, run_preflight, study_findings
    from hpctrain.launch.submission import backend_for

    slurm_backend = backend_for(job, local) == "slurm"
    slurm = slurm or Slurm()
    if slurm_backend and not slurm.available():
        return []  # submit() says that this machine cannot submit, which comes first
    if job.is_study:  # every point, each finding once, naming the points it concerns
        findings = study_findings(
            [(p.label, run_preflight(p.job, slurm_backend=slurm_backend, slurm=slurm)) for p in job.points]
        )
    else:
        findings = run_preflight(job, slurm_backend=slurm_backend, slurm=slurm)
    if job.spec.tracking.trackers:  # the network's word on the trackers: warnings, bounded (diagnose/tracker_reach.py)
        from hpctrain.diagnose.tracker_reach import check_trackers

        findings += check_trackers(job.spec)
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
