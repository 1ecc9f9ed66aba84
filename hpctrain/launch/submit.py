"""The submit verb's one sequence (``hpctrain submit``, ``hpctrain.submit``), and the follow-up resume shares.

warnings -> the dry run (which stops there) -> the checks before the queue ->
submit (a study: every point as its own job) -> follow a local run to its end,
or wait for a Slurm job. Both faces call :func:`submit` and differ only in
what they do with what it hears on the way (:class:`Steps`: the CLI prints
each step as it comes) and with what it returns (:class:`Submission`: the CLI
prints it and exits with a code, the Python API returns it). A local run
stopped by a signal while it is followed raises :class:`~hpctrain.errors.RunStopped`
(Ctrl-C: ``KeyboardInterrupt``) in both.

A spec path is read here; a ``LoadedJob`` is checked again first
(``jobspec/load.py``'s ``revalidated``): one edited after ``load_job`` is
submitted only if it still passes every check ``load_job`` made. Torch-free;
submitit is imported only to submit.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from hpctrain.errors import RunStopped
from hpctrain.launch import plan

if TYPE_CHECKING:
    from hpctrain.contract.slurm import Slurm
    from hpctrain.jobspec.load import LoadedJob
    from hpctrain.launch.code_snapshot import Snapshot
    from hpctrain.launch.submission import SubmittedRun
    from hpctrain.planning.forecast import Forecast


@dataclass(frozen=True)
class Submission:
    """A submitted run (or, for a dry run, the one a submit would make).

    ``run_dir``: the run directory (a study's directory for a study; for a dry run, the
    directory a submit now would create); ``job_id``: Slurm's job id, or the local run's
    controller PID (None for a dry run); ``cluster``: the profile's name; ``script``: the exact
    sbatch script (dry run of a Slurm job only); ``plan``: all that ``hpctrain submit --dry-run``
    prints (dry run only); ``points``: a study's runs, one per point, each labelled;
    ``warnings``: what the spec and the checks before the queue found allowed but likely to
    hurt, and the bad-node ledger's exclusions; ``state``: once waited for, the job's end (Slurm's
    state; a local run's status); ``run_completed``: the run's own summary says it completed, whatever
    Slurm called the job's end (``follow.run_completed``); ``code``: what the code snapshot copied and
    left out; ``forecast``: a queued Slurm run's expected start and finish (``planning/forecast.py``),
    also recorded in the run (``contract/estimates.py``).
    """

    run_dir: Path
    job_id: str | None
    backend: Literal["slurm", "local"]
    script: str | None = None
    plan: str | None = None
    label: str | None = None
    points: tuple[Submission, ...] = ()
    warnings: tuple[str, ...] = ()
    state: str | None = None
    run_completed: bool = False
    cluster: str | None = None
    world_size: int | None = None
    code: Snapshot | None = None
    forecast: Forecast | None = None

    @property
    def ended_well(self) -> bool | None:
        """Whether what was waited for ended well (a study: every point); None when nothing was waited for."""
        if self.points:
            ends = [point.ended_well for point in self.points]
            return None if all(end is None for end in ends) else all(end is not False for end in ends)
        if self.state is None:
            return None
        if self.backend == "local":
            return self.state in ("completed", "running")
        from hpctrain.contract.slurm_states import succeeded

        return succeeded(self.state) or self.run_completed

    def as_json(self) -> dict[str, Any]:
        """What ``submit --json`` (and ``resume --json``) prints."""
        if self.points:
            runs = [{"job_id": p.job_id, "run_dir": str(p.run_dir), "label": p.label, "world_size": p.world_size}
                    for p in self.points]  # fmt: skip
            return {"study_dir": str(self.run_dir), "runs": runs}
        found = {"job_id": self.job_id, "run_dir": str(self.run_dir), "cluster": self.cluster, "backend": self.backend}
        return found if self.forecast is None else {**found, "estimate": self.forecast.record()}


class Steps:
    """What a face hears while a sequence goes; here each step is heard and ignored (the Python API).

    ``log``: where a local run's rank 0 log goes while it is followed (None: nowhere).
    """

    log: TextIO | None = None

    def warned(self, warnings: Sequence[str]) -> None:
        """Things found allowed but likely to hurt (never fatal)."""

    def submitted(self, submission: Submission) -> None:
        """The job (or every point of a study) is queued or started; before anything is followed."""

    def following(self, label: str, world_size: int) -> None:
        """A local study point is followed now (the next one starts after it ends)."""

    def ended(self, submission: Submission) -> None:
        """A Slurm job that was waited for has ended (``submission.state``)."""


def submit(
    job: LoadedJob | str | Path,
    *,
    overrides: Sequence[str] = (),
    cluster: str | None = None,
    dry_run: bool = False,
    local: bool = False,
    wait: bool = False,
    follow_local: bool = False,
    preflight: bool = True,
    snapshot: bool = True,
    exclude_bad_nodes: bool = True,
    steps: Steps | None = None,
    slurm: Slurm | None = None,
    after: str | None = None,
) -> Submission:
    """Submit ``job`` to Slurm, or run it here (``local``, or a local cluster profile).

    ``job``: a spec path (read with ``overrides`` and ``cluster``, as ``load_job`` does), or a
    ``load_job`` result, which is checked again first (it may have been changed since).

    ``dry_run``: touch nothing, return the script and the plan. ``wait``: return once the job ended,
    with ``state``. ``follow_local``: follow a local run to its end even without ``wait`` (a command
    line's process must: the run ends with it). ``preflight=False`` skips the checks before the
    queue, ``snapshot=False`` the code copy, ``exclude_bad_nodes=False`` the bad-node ledger's
    ``--exclude``. ``after``: start once that run (a run directory or job id) has completed (``after.run``;
    docs/chains.md).
    """
    from hpctrain.jobspec.load import load_job, revalidated
    from hpctrain.launch.submission import backend_for

    steps = steps or Steps()
    from hpctrain.launch.chain import after_override, with_upstream

    job = (
        load_job(job, [*overrides, *after_override(after)], cluster=cluster, check_program=True)
        if isinstance(job, (str, Path))
        else revalidated(with_upstream(job, after))
    )
    if job.spec.after is not None:  # the upstream resolved, the dependency on its current job (launch/chain.py)
        from hpctrain.launch.chain import linked

        job = linked(job, local=local, slurm=slurm)
    warnings = plan.spec_warnings(job) + ([] if job.is_study else plan.container_warnings(job, local=local))
    steps.warned(warnings)
    backend = backend_for(job, local)
    if dry_run:
        from hpctrain.launch.dry_run import dry_run as render

        planned = render(job, local=local, snapshot=snapshot, exclude_bad_nodes=exclude_bad_nodes)
        return Submission(planned.run_dir, None, backend, script=planned.script, plan=planned.text,
                          warnings=tuple(warnings), cluster=job.profile.name)  # fmt: skip
    if preflight:
        checked = plan.check_before_queueing(job, local=local, slurm=slurm)
        steps.warned(checked)
        warnings += checked
    if job.is_study:
        return _submit_study(
            job, local=local, wait=wait, snapshot=snapshot, steps=steps, warnings=warnings, slurm=slurm
        )
    from hpctrain.launch.submission import submit_run

    submitted = submit_run(job, local=local, snapshot=snapshot, exclude_bad_nodes=exclude_bad_nodes)
    if job.spec.after is not None:
        from hpctrain.launch.chain import record

        record(submitted.run_dir, job, cancel=lambda: [one.cancel(check=False) for one in submitted.jobs])
    steps.warned(submitted.notes)  # the bad-node ledger's exclusions
    one = Submission(submitted.run_dir, submitted.job_id, submitted.backend, warnings=(*warnings, *submitted.notes),
                     cluster=job.profile.name, world_size=job.spec.world_size, code=submitted.code,
                     forecast=forecast_of(job, submitted, slurm))  # fmt: skip
    steps.submitted(one)
    return finish(one, submitted, wait=wait or (follow_local and backend == "local"), steps=steps, slurm=slurm)


def finish(one: Submission, submitted: SubmittedRun, *, wait: bool, steps: Steps, slurm: Slurm | None) -> Submission:
    """``one`` once its job ended (when ``wait``): a local run followed in the foreground, a Slurm job waited for."""
    if not wait:
        return one
    from hpctrain.launch import follow

    if submitted.backend == "slurm":
        state = follow.wait_for_job(submitted, slurm)
        ended = replace(one, state=state, run_completed=follow.run_completed(submitted))
        steps.ended(ended)
        return ended
    code = follow.follow_local(submitted, stream=steps.log if steps.log is not None else io.StringIO())
    _raise_for_stop(code, submitted.run_dir)
    return replace(one, state=follow.local_status(submitted))


def forecast_of(job: LoadedJob, submitted: SubmittedRun, slurm: Slurm | None, **how: Any) -> Forecast | None:
    """A queued Slurm run's expected start and finish, recorded in the run; None for a local run, a
    study or sweep, or when it could not be made (an estimate never fails a submit)."""
    if submitted.backend != "slurm" or job.is_study or job.spec.sweep or not submitted.job_id:
        return None
    from hpctrain.contract.estimates import record_estimate
    from hpctrain.contract.slurm import Slurm
    from hpctrain.errors import HpctrainError
    from hpctrain.planning.forecast import forecast

    try:
        made = forecast(job, submitted.job_id, slurm if slurm is not None else Slurm(), **how)
    except (HpctrainError, OSError, ValueError):
        return None
    try:
        record_estimate(submitted.run_dir, made.record())
    except OSError:
        pass  # shown, not kept: report has no prediction to compare with
    return made


def _raise_for_stop(code: int, run_dir: Path, note: str = "") -> None:
    """A followed local run that a signal stopped (exit code 128 + the signal) ends the sequence."""
    if code >= 128:
        from hpctrain.launch.follow import stop_name, what_it_kept

        raise RunStopped(
            f"{stop_name(code - 128)}: the local run {run_dir} was stopped{note}; {what_it_kept(run_dir)}",
            code,
            hint=f"'hpctrain resume {run_dir} --local' (hpctrain.resume({str(run_dir)!r}, local=True)) continues it",
        )


def _submit_study(
    job: LoadedJob,
    *,
    local: bool,
    wait: bool,
    snapshot: bool,
    steps: Steps,
    warnings: list[str],
    slurm: Slurm | None,
) -> Submission:
    """Every point as its own job; local points run one after another, each followed to its end."""
    from hpctrain.launch import follow
    from hpctrain.launch.study import submit_study
    from hpctrain.launch.submission import backend_for

    ended: dict[str, str] = {}

    def follow_point(point, submitted) -> None:  # noqa: ANN001 - StudyPoint, SubmittedRun
        if submitted.backend == "local":
            steps.following(point.label, point.job.spec.world_size)
            code = follow.follow_local(submitted, stream=steps.log if steps.log is not None else io.StringIO())
            _raise_for_stop(code, submitted.run_dir, f" at study point {point.label}; later points were not started")
            ended[point.label] = follow.local_status(submitted)

    study = submit_study(job, local=local, snapshot=snapshot, after_each=follow_point)
    points = tuple(
        Submission(submitted.run_dir, submitted.job_id, submitted.backend, label=point.label,
                   state=ended.get(point.label), cluster=point.job.profile.name, world_size=point.job.spec.world_size)
        for point, submitted in study.runs
    )  # fmt: skip
    backend = points[0].backend if points else backend_for(job, local)
    whole = Submission(
        study.study_dir, None, backend, points=points, warnings=tuple(warnings), cluster=job.profile.name
    )
    steps.submitted(whole)
    if not wait or backend == "local":
        return whole
    waited = []
    for point, (_, submitted) in zip(points, study.runs, strict=True):
        waited.append(finish(point, submitted, wait=True, steps=steps, slurm=slurm))
    return replace(whole, points=tuple(waited))
