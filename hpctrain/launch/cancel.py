"""The cancel verb (``hpctrain cancel``, ``hpctrain.cancel``): one policy, one protocol, for both faces.

Policy. Cancelling asks that no process of the run be left and that it not
come back by itself. :func:`run_activity` says where a run's last attempt
stands -- running, stopping (its job has ended but its tasks are still
writing), ended, or unknown -- and ``resume`` asks the same question:

* a run that has ended is not cancelled: nothing is written or signalled, and
  the answer says it had already ended (``Cancelled.already_ended``). That is
  no error: what cancel asks for holds. ``hpctrain cancel`` prints it and
  exits 0, ``hpctrain.cancel`` returns it;
* a run whose process nothing proves to be the run's is refused
  (``RunDirError``): a local run without proof, another user's;
* a study: every submitted point, as a run; one point's trouble does not keep
  the others from being cancelled, and is reported after them.

Protocol. Order matters: the cancel marker goes into the run directory
*before* ``scancel``, so the tasks read the SIGTERM that follows as a cancel
(save, stop, never requeue) rather than a preemption. Slurm then signals
every task; each task's clean-up watcher ends whatever the task started
(docs/preemption.md). Slurm says CANCELLED at once, while rank 0 is still
writing the stop checkpoint, so cancel then waits for the run to settle -- no
process of the job left -- bounded by Slurm's KillWait plus a margin, and only
then says where the run stands. A local run is signalled only once
``launch/local_run.py`` has proven its PID to be the run's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hpctrain.contract import job_registry
from hpctrain.contract.cancel_marker import write_cancel_marker
from hpctrain.contract.checkpoint_listing import latest_checkpoint_step
from hpctrain.contract.rundir import RUN_FILE, read_run_info, trial_dir
from hpctrain.contract.slurm import Slurm, SlurmCommandError, WaitTimedOut, checked_job_id
from hpctrain.contract.slurm_states import is_final
from hpctrain.contract.study_file import point_dir, read_study, study_dir_of
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.errors import ClusterError, HpctrainError, RunDirError
from hpctrain.launch import local_run

# Beyond KillWait: slurmd's epilog, and rank 0 writing summary.json after the checkpoint.
SETTLE_MARGIN_S = 10.0
DEFAULT_TIMEOUT_S = 60.0  # 'hpctrain cancel --timeout': time for Slurm to end the job
MAX_LOCAL_TRIALS = 1000  # a local sweep starts every trial at once on one machine: never near this

Activity = Literal["running", "stopping", "ended", "unknown"]


@dataclass(frozen=True)
class RunActivity:
    """Where a run's last attempt stands (``state``), in words (``why``) a refusal or a report can use
    (for a run that has ended: Slurm's final state, or what shows a local run's end)."""

    state: Activity
    why: str


@dataclass(frozen=True)
class Cancelled:
    """Where a cancelled run stands once it settled (or the wait for it ran out).

    ``state``: the job's end as Slurm says it (or each local trial's); ``status``: the run's
    own, from its summary; ``settled``: no process of the job is left (``False``: some task
    may still be writing after ``limit_s``); ``checkpoint_step``: the last complete checkpoint;
    ``already_ended``: the run had ended before, so nothing was written or signalled;
    ``script``: a ``script:`` run, whose checkpoints are its script's own (hpctrain does not see them).
    """

    run_dir: Path
    job_id: str
    state: str
    status: str
    settled: bool
    limit_s: float
    checkpoint_step: int | None
    already_ended: bool = False
    script: str | None = None
    dependents: tuple[Path, ...] = ()  # the runs chained after it, cancelled with it (after:, docs/chains.md)


def cancelled_json(done: Cancelled) -> dict[str, Any]:
    """What ``cancel --json`` prints for a run: ``Cancelled``'s fields, paths as text."""
    return {
        **{name: getattr(done, name) for name in done.__dataclass_fields__},
        "run_dir": str(done.run_dir),
        "dependents": [str(path) for path in done.dependents],
    }


@dataclass(frozen=True)
class PointCancelled:
    """One study point's part of a study's cancel: its result, the error it met, or that it was never
    submitted (``result`` and ``error`` both None)."""

    label: str
    run_dir: Path
    result: Cancelled | None = None
    error: HpctrainError | None = None


@dataclass(frozen=True)
class StudyCancelled:
    """A study's cancel: one ``PointCancelled`` per point of its study.json, in its order."""

    study_dir: Path
    points: tuple[PointCancelled, ...]

    @property
    def failed(self) -> tuple[PointCancelled, ...]:
        return tuple(point for point in self.points if point.error is not None)

    def error(self) -> HpctrainError | None:
        """The points that could not be cancelled, as one error with the worst point's exit code (what
        ``hpctrain cancel`` exits with, what ``hpctrain.cancel`` raises); None when every point is done."""
        failed = [point.error for point in self.failed if point.error is not None]
        if not failed:
            return None
        said = "; ".join(f"{point.label}: {point.error.message}" for point in self.failed if point.error is not None)
        error = HpctrainError(
            f"{self.study_dir}: {len(failed)} point(s) could not be cancelled: {said}", failed[0].hint
        )
        error.exit_code = max(each.exit_code for each in failed)
        return error


def cancel(
    target: str, timeout_s: float = DEFAULT_TIMEOUT_S, *, slurm: Slurm | None = None
) -> Cancelled | StudyCancelled:
    """The cancel verb's one door (``hpctrain cancel``, ``hpctrain.cancel``): ``target`` names a study
    directory (every point is cancelled: :func:`cancel_study`) or a run (a run directory or a Slurm job id:
    :func:`cancel_run`). A missing path, or a folder that is neither, is a ``RunDirError``."""
    if (study_dir := study_dir_of(target)) is None:
        from hpctrain.launch.chain import cancel_dependents

        run_dir = job_registry.resolve_run(target)
        # its chain first, so that no dependent starts on the cancel of its upstream (launch/chain.py)
        chained = cancel_dependents(run_dir, lambda one: cancel_run(one, timeout_s, slurm=slurm))
        return replace(cancel_run(run_dir, timeout_s, slurm=slurm), dependents=tuple(chained))
    points = cancel_study(study_dir, read_study(study_dir)["points"], timeout_s, slurm=slurm)
    return StudyCancelled(study_dir, tuple(points))


def run_activity(run_dir: Path, info: dict[str, Any], slurm: Slurm) -> RunActivity:
    """Whether the run's last attempt may still write into ``run_dir``; asks before anything is written.

    Local: its controller proven alive is running (stopping when its summary is final already), a
    live PID nothing proves is another's counts as running too, and a controller gone while processes
    carrying the run's token are left is stopping. Slurm: a job that has not ended is
    running; one that ended while Slurm still has processes of it is stopping (COMPLETING: the ranks
    are saving). Unknown: a sweep (each trial answers for itself), or no Slurm here to ask.
    """
    if info.get("trials"):
        return RunActivity("unknown", "a sweep: each trial answers for itself")
    job_id = str(info.get("job_id") or "")
    if info.get("backend") == "local":
        summary = read_summary(run_dir) or Summary()
        if local_run.liveness(info, run_dir) == "gone":
            record = local_run.parse_record(info, run_dir)
            left = local_run.run_processes(record) if record is not None else []
            if left:
                return RunActivity("stopping", f"its controller is gone, but {len(left)} of its processes are left")
            return RunActivity("ended", "its summary is final" if summary.is_final else "its process is gone")
        if summary.is_final:
            return RunActivity("stopping", f"its summary is final (status {summary.status}); pid {job_id} is exiting")
        return RunActivity("running", f"the previous local attempt of this run (pid {job_id}) may still be running")
    if not job_id or not slurm.available():
        return RunActivity("unknown", "no Slurm here to ask")
    job_id = _slurm_job_id(run_dir, job_id)
    state = slurm.job_state(job_id)
    if not is_final(state):
        return RunActivity("running", f"job {job_id} of this run is still {state}")
    if slurm.processes_may_run(job_id):
        return RunActivity(
            "stopping",
            f"job {job_id} of this run ended ({state}), but its tasks are still stopping and may be writing "
            "the stop checkpoint",
        )
    return RunActivity("ended", state)


def cancel_run(run_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S, *, slurm: Slurm | None = None) -> Cancelled:
    """Cancel one run's job and wait until none of its processes is left; where it stands then.

    A run that has ended comes back ``already_ended`` with nothing written or signalled. Raises
    ``RunDirError`` for a run.json that names no job of this run (nothing is signalled), ``ClusterError``
    when Slurm does not end the job within ``timeout_s``.
    """
    slurm = slurm or Slurm()
    info = read_run_info(run_dir)
    job_id = str(info.get("job_id", ""))
    if info.get("backend") == "local" and not info.get("trials"):
        _local_pid(run_dir, info)  # before anything is asked, written or sent
    activity = run_activity(run_dir, info, slurm)
    if activity.state == "ended":
        return _already_ended(run_dir, job_id, activity)
    limit_s = 0.0
    if info.get("backend") == "local":
        state = _cancel_local_trials(run_dir, info, timeout_s)
        summary, settled = read_summary(run_dir) or Summary(), True
    else:
        job_id = _slurm_job_id(run_dir, job_id)  # before anything is written or sent
        write_cancel_marker(run_dir, [job_id])
        state = _cancel_slurm(slurm, job_id, timeout_s)
        limit_s = slurm.kill_wait_s() + SETTLE_MARGIN_S
        summary, settled = wait_to_settle(run_dir, lambda: slurm.processes_may_run(job_id), limit_s)
    status = summary.status or "unknown"
    if settled and not summary.is_final and summary.status is not None:
        status = f"stopped (the job ended before the run recorded it; its summary still says {summary.status})"
    script = (summary.model_extra or {}).get("script")
    script = script if isinstance(script, str) else None
    return Cancelled(run_dir, job_id, state, status, settled, limit_s, latest_checkpoint_step(run_dir), script=script)


def cancel_study(
    study_dir: Path, points: list[dict[str, Any]], timeout_s: float = DEFAULT_TIMEOUT_S, *, slurm: Slurm | None = None
) -> list[PointCancelled]:
    """Cancel every submitted point of a study (``points``: study.json's records) through :func:`cancel_run`;
    one point's error is recorded and the next point is cancelled all the same."""
    slurm = slurm or Slurm()
    done = []
    for point in points:
        label, one_dir = str(point.get("label")), point_dir(study_dir, point)
        if not point.get("job_id"):
            done.append(PointCancelled(label, one_dir))
            continue
        try:
            done.append(PointCancelled(label, one_dir, result=cancel_run(one_dir, timeout_s, slurm=slurm)))
        except HpctrainError as exc:
            done.append(PointCancelled(label, one_dir, error=exc))
    return done


def wait_to_settle(
    run_dir: Path, processes_may_run: Callable[[], bool], limit_s: float, poll_s: float = 0.5
) -> tuple[Summary, bool]:
    """Wait until no process of the job is left, at most ``limit_s``; the summary then, and
    whether the run settled: no process left, or its summary final when time ran out.

    A final summary alone is not enough: its ranks are still exiting (the job is
    COMPLETING), and a ``resume`` typed then would be refused (seen on the test cluster).
    """
    deadline = time.monotonic() + limit_s
    while True:
        if not processes_may_run():
            return read_summary(run_dir) or Summary(), True
        if time.monotonic() >= deadline:
            summary = read_summary(run_dir) or Summary()
            return summary, summary.is_final
        time.sleep(poll_s)


def _already_ended(run_dir: Path, job_id: str, activity: RunActivity) -> Cancelled:
    summary = read_summary(run_dir) or Summary()
    state = f"already ended ({activity.why})"
    return Cancelled(
        run_dir, job_id, state, summary.status or "unknown", True, 0.0, latest_checkpoint_step(run_dir), True
    )


def _slurm_job_id(run_dir: Path, job_id: str) -> str:
    """run.json's job id, refused (naming the file) unless it names exactly one Slurm job."""
    try:
        return checked_job_id(job_id)
    except SlurmCommandError as exc:
        raise RunDirError(f"{run_dir / RUN_FILE}: {exc}", hint=exc.hint) from None


def _local_pid(run_dir: Path, info: dict) -> int:
    """run.json's job id as a local run's controller PID, refused (naming the file) unless it names one."""
    pid = local_run.valid_pid(info.get("job_id"))
    if pid is None:
        raise RunDirError(
            f"{run_dir / RUN_FILE}: job_id {str(info.get('job_id'))[:40]!r} is not the process id of a local run "
            "(a whole number above 1); not signalled",
            hint="this run.json was edited or damaged; nothing was stopped",
        )
    return pid


def _cancel_slurm(slurm: Slurm, job_id: str, timeout_s: float) -> str:
    state = slurm.job_state(job_id)
    if is_final(state):
        return f"already ended ({state})"  # its tasks are still stopping: the marker makes that a cancel
    slurm.cancel_job(job_id)
    try:
        return slurm.wait_for(job_id, timeout_s=timeout_s, poll_s=1.0)
    except WaitTimedOut as exc:
        raise ClusterError(
            f"job {job_id} is still {exc.state} {timeout_s:.0f} s after scancel",
            hint="a node may be unresponsive; ask the admins, or check 'scontrol show job " + job_id + "'",
        ) from None


def _cancel_local_trials(run_dir: Path, info: dict, timeout_s: float) -> str:
    """A local sweep runs one controller per trial: stop each (a plain run is its own one trial)."""
    trials = info.get("trials")
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        return _cancel_local(run_dir, info, timeout_s)
    states = []
    for index in range(min(trials, MAX_LOCAL_TRIALS)):
        one_dir = trial_dir(run_dir, index)
        try:
            states.append(f"{one_dir.name}: {_cancel_local(one_dir, read_run_info(one_dir), timeout_s)}")
        except RunDirError as exc:
            states.append(f"{one_dir.name}: not signalled ({exc.message})")
    return "; ".join(states)


def _cancel_local(run_dir: Path, info: dict, timeout_s: float) -> str:
    """Stop a local run's controller (and through it its tasks), proven to be the run's first."""
    if (read_summary(run_dir) or Summary()).is_final:
        return "already ended (its summary is final)"
    _local_pid(run_dir, info)
    record = local_run.parse_record(info, run_dir)
    if record is None:
        if local_run.liveness(info, run_dir) == "gone":
            return "already ended"
        raise RunDirError(
            f"{run_dir / RUN_FILE}: nothing proves that process {str(info.get('job_id'))[:40]!r} is this local run's "
            "(no start time and run token recorded: an older hpctrain wrote it, or it was edited); not signalled",
            hint="if the run is still going, stop it where it runs (Ctrl-C in its terminal), or check the process "
            "with 'ps -o pid,lstart,args -p PID' before killing it yourself",
        )
    if local_run.liveness(info, run_dir) == "unproven":
        raise RunDirError(
            f"{run_dir / RUN_FILE}: process {record.pid} started when the run's did, but it is not yours "
            "to inspect, so nothing proves it is the run's; not signalled",
            hint="only the user who started a local run can cancel it",
        )
    if local_run.run_process(record) is None and not local_run.run_processes(record):
        return f"already ended (process {record.pid} is gone or no longer the run's)"
    write_cancel_marker(run_dir, [str(record.pid)])  # the tasks read the SIGTERM as a cancel: save, stop
    outcome = local_run.stop([record], timeout_s)
    return {"ended": "CANCELLED", "killed": "CANCELLED (killed)", "gone": "already ended"}[outcome]
