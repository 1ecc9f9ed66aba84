"""The Python API: what the login-node verbs do, as functions (``import hpctrain``).

``hpctrain.submit(hpctrain.load_job("jobs/x.yaml"), wait=True)`` runs the same
library code as ``hpctrain submit jobs/x.yaml --wait``: the same dry-run
script, the same checks before the queue, the same status rule and cancel
protocol. Nothing here exits or imports torch, and nothing prints but a local run
stopped by Ctrl-C or a signal while waiting (on stderr); every refusal is an
``HpctrainError`` (``hpctrain.errors``) with a ``hint``. ``hpctrain/__init__.py``
exposes these names lazily, so ``import hpctrain`` stays cheap.
"""

from __future__ import annotations

import io
import signal
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from hpctrain.errors import HpctrainError, UsageError

if TYPE_CHECKING:
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.cancel import Cancelled
    from hpctrain.launch.submission import SubmittedRun
    from hpctrain.observe.run_status import RunStatus


@dataclass(frozen=True)
class Submission:
    """A submitted run (or, for ``dry_run=True``, the one a submit would make).

    ``run_dir``: the run directory (a study's directory for a study; for a dry run, the
    directory a submit now would create); ``job_id``: Slurm's job id, or the local run's
    controller PID (None for a dry run); ``script``: the exact sbatch script (dry run of a
    Slurm job only); ``plan``: all that ``hpctrain submit --dry-run`` prints (dry run only);
    ``points``: a study's runs, one per point, each labelled; ``warnings``: what the spec
    and the checks before the queue found allowed but likely to hurt.
    """

    run_dir: Path
    job_id: str | None
    backend: Literal["slurm", "local"]
    script: str | None = None
    plan: str | None = None
    label: str | None = None
    points: tuple[Submission, ...] = ()
    warnings: tuple[str, ...] = ()
    state: str | None = None  # wait=True: the job's end (Slurm's state; a local run's status)


@dataclass(frozen=True)
class StudyStatus:
    """A study's status: what ``hpctrain status STUDY --json`` prints; ``points``: one row per point
    (its record from study.json joined with its run's status)."""

    study_dir: str
    name: str | None
    points: tuple[dict[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"study_dir": self.study_dir, "name": self.name, "points": list(self.points)}


@dataclass(frozen=True)
class Report:
    """A written report: ``html`` (self-contained) and ``markdown`` in ``out_dir`` with ``files``
    (the PNGs among them); ``table``: the scaling table's rows, ``runs``: each run's curves in
    brief, ``notes``: what could not be read or drawn (the same facts as ``report --json``)."""

    out_dir: Path
    html: Path
    markdown: Path
    files: tuple[Path, ...]
    table: tuple[dict[str, Any], ...]
    runs: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


def load_job(path: str | Path, overrides: Sequence[str] = (), *, cluster: str | None = None) -> LoadedJob:
    """Read and validate a job spec, as ``hpctrain validate PATH --set KEY=VALUE``; ``overrides``:
    ``"key=value"`` strings (the value is read as YAML). Raises ``SpecError`` listing every problem."""
    from hpctrain.jobspec.load import load_job as load

    return load(path, _listed(overrides), cluster=cluster)


def submit(
    job: LoadedJob | str | Path,
    *,
    dry_run: bool = False,
    local: bool = False,
    wait: bool = False,
    preflight: bool = True,
    snapshot: bool = True,
    exclude_bad_nodes: bool = True,
    log: TextIO | None = None,
) -> Submission:
    """Submit a job (a ``load_job`` result, or a spec path) to Slurm, or with ``local=True`` run it here.

    ``dry_run``: touch nothing, return the sbatch ``script`` and the ``plan``. ``wait``: return once
    the job ended (a local run: its processes; Slurm: the job) with ``state`` set. Without ``wait`` a
    local run goes on in the background while this Python process lives. ``preflight=False`` skips
    the checks before the queue (``--no-preflight``), ``snapshot=False`` the code copy
    (``--no-snapshot``), ``exclude_bad_nodes=False`` the bad-node ledger's ``--exclude``
    (``--no-exclude``); ``log``: a stream that gets rank 0's log of a local run while waiting.
    """
    from hpctrain.launch import plan

    job = job if not isinstance(job, (str, Path)) else load_job(job)
    warnings = plan.spec_warnings(job) + ([] if job.is_study else plan.container_warnings(job, local=local))
    if dry_run:
        from hpctrain.launch.dry_run import dry_run as render

        planned = render(job, local=local, snapshot=snapshot, exclude_bad_nodes=exclude_bad_nodes)
        backend = _backend(job, local)
        return Submission(
            planned.run_dir, None, backend, script=planned.script, plan=planned.text, warnings=tuple(warnings)
        )
    if preflight:
        warnings += plan.check_before_queueing(job, local=local)
    if job.is_study:
        return _submit_study(job, local=local, wait=wait, snapshot=snapshot, log=log, warnings=warnings)
    from hpctrain.launch.submission import submit as submit_job

    submitted = submit_job(job, local=local, snapshot=snapshot, exclude_bad_nodes=exclude_bad_nodes)
    return _finish(submitted, wait=wait, log=log, warnings=[*warnings, *submitted.notes])


def status(run: str | Path) -> RunStatus | StudyStatus:
    """A run's status (a run directory or a Slurm job id): ``RunStatus``, the facts
    ``hpctrain status RUN --json`` prints; a study directory: ``StudyStatus``, one row per point."""
    from hpctrain.launch.study import study_dir_of

    if (study_dir := study_dir_of(run)) is not None:
        from hpctrain.observe.study_status import study_status

        document = study_status(study_dir)
        return StudyStatus(document["study_dir"], document["name"], tuple(document["points"]))
    from hpctrain.contract.job_registry import resolve_run
    from hpctrain.observe.run_status import RunStatus, status_with_ranks

    facts, _ranks = status_with_ranks(resolve_run(str(run)))
    return RunStatus(**facts)


def cancel(run: str | Path, *, timeout_s: float = 60.0) -> Cancelled | tuple[Cancelled, ...]:
    """Cancel a run (run directory or job id) and wait until no process of it is left: ``Cancelled``
    (the job's end, the run's status, the last checkpoint's step). A study: each point still going.

    A run that has already ended is refused (``UsageError``) before anything is written or signalled;
    so is a run whose process nothing proves to be the run's (``RunDirError``).
    """
    from hpctrain.contract.job_registry import resolve_run
    from hpctrain.launch import cancel as protocol
    from hpctrain.launch.study import point_dir, read_study, study_dir_of

    if (study_dir := study_dir_of(run)) is not None:
        dirs = [point_dir(study_dir, p) for p in read_study(study_dir)["points"] if p.get("job_id")]
        going = [d for d in dirs if protocol.ended_already(d) is None]
        if not going:
            raise UsageError(f"{study_dir}: no point of this study is still going; nothing to cancel")
        return tuple(protocol.cancel_run(d, timeout_s) for d in going)
    run_dir = resolve_run(str(run))
    if (why := protocol.ended_already(run_dir)) is not None:
        raise UsageError(
            f"{run_dir} has already ended ({why}); nothing to cancel",
            hint=f"hpctrain.status({str(run_dir)!r}) says how it ended; hpctrain.resume(...) continues it",
        )
    return protocol.cancel_run(run_dir, timeout_s)


def resume(
    run: str | Path,
    overrides: Sequence[str] = (),
    *,
    local: bool = False,
    wait: bool = False,
    log: TextIO | None = None,
) -> Submission:
    """Continue a stopped, cancelled or failed run as a new job in the same run directory, from its
    latest checkpoint; ``overrides``: ``resources.*`` only (another shape that keeps the global batch).

    Refused (``UsageError``) for a study, a sweep, or while the previous attempt may still be writing.
    """
    from hpctrain.launch import plan
    from hpctrain.launch import resume as resuming

    run_dir, job = resuming.prepare(run, _listed(overrides))
    warnings = plan.spec_warnings(job, run_dir)
    return _finish(resuming.start(run_dir, job, local=local), wait=wait, log=log, warnings=warnings)


def report(
    runs: str | Path | Sequence[str | Path], *, out: str | Path | None = None, baseline: str | None = None
) -> Report:
    """Plots and tables from runs and studies, as ``hpctrain report``: ``report.html`` (self-contained)
    and ``report.md`` in ``out`` (default: RUN/report for one run; required for several).

    Never overwrites a file it did not write (``UsageError``).
    """
    from hpctrain.observe.report.build import as_json, make_report

    targets = [runs] if isinstance(runs, (str, Path)) else list(runs)
    written = make_report([Path(t) for t in targets], Path(out) if out is not None else None, baseline)
    facts = as_json(written)
    return Report(
        out_dir=written.out_dir,
        html=written.out_dir / "report.html",
        markdown=written.out_dir / "report.md",
        files=tuple(written.files),
        table=tuple(facts["table"]),
        runs=tuple(facts["runs"]),
        notes=tuple(facts["notes"]),
    )


# ------------------------------------------------------------------ helpers


def _listed(overrides: Sequence[str]) -> list[str]:
    """``overrides`` as a list; a bare string (which would be read letter by letter) is refused."""
    if isinstance(overrides, str):
        raise UsageError(f"overrides={overrides!r}: give a list of 'key=value' strings", hint=f"[{overrides!r}]")
    return list(overrides)


def _backend(job: LoadedJob, local: bool) -> Literal["slurm", "local"]:
    from hpctrain.launch.submission import backend_for

    return backend_for(job, local)


def _finish(submitted: SubmittedRun, *, wait: bool, log: TextIO | None, warnings: list[str]) -> Submission:
    """The submission; with ``wait``, once its job ended."""
    one = Submission(submitted.run_dir, submitted.job_id, submitted.backend, warnings=tuple(warnings))
    return replace(one, state=_wait(submitted, log)) if wait else one


def _wait(submitted: SubmittedRun, log: TextIO | None) -> str:
    """Block until the job ended; Slurm's final state, or a local run's status."""
    from hpctrain.contract.rundir import Summary, read_summary
    from hpctrain.launch import follow

    if submitted.backend == "slurm":
        return follow.wait_for_job(submitted)
    code = follow.follow_local(submitted, stream=log if log is not None else io.StringIO())
    if code == 130:
        raise KeyboardInterrupt
    if code >= 128:
        name = signal.Signals(code - 128).name
        raise HpctrainError(
            f"{name}: the local run {submitted.run_dir} was stopped",
            hint=f"it keeps its last checkpoint; hpctrain.resume({str(submitted.run_dir)!r}, local=True) continues it",
        )
    return (read_summary(submitted.trial_dirs[0]) or Summary()).status or "completed"


def _submit_study(
    job: LoadedJob, *, local: bool, wait: bool, snapshot: bool, log: TextIO | None, warnings: list[str]
) -> Submission:
    """Every point as its own job; local points run one after another (each to its end)."""
    from hpctrain.launch.study import submit_study

    ended: dict[str, str] = {}

    def follow_point(point, submitted) -> None:  # noqa: ANN001 - StudyPoint, SubmittedRun
        if submitted.backend == "local":
            ended[point.label] = _wait(submitted, log)

    study = submit_study(job, local=local, snapshot=snapshot, after_each=follow_point)
    points = []
    for point, submitted in study.runs:
        state = ended.get(point.label) or (_wait(submitted, log) if wait else None)
        points.append(
            Submission(submitted.run_dir, submitted.job_id, submitted.backend, label=point.label, state=state)
        )
    backend = points[0].backend if points else _backend(job, local)
    return Submission(study.study_dir, None, backend, points=tuple(points), warnings=tuple(warnings))
