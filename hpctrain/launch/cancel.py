"""The cancel protocol (``hpctrain cancel``, ``hpctrain.cancel``): cancel a run so that nothing it started survives.

Order matters: the cancel marker goes into the run directory *before*
``scancel``, so the tasks read the SIGTERM that follows as a cancel (save,
stop, never requeue) rather than a preemption. Slurm then signals every task;
each task's clean-up watcher ends whatever the task started, data-loader
workers and anything that called setsid included, also where Slurm's
``proctrack/linuxproc`` would leave them running (docs/preemption.md).

Slurm says CANCELLED at once, while the ranks are still agreeing on the
stop step and rank 0 is writing the stop checkpoint. So ``cancel`` then
waits for the run to settle -- no process of the job left (by then
``summary.json`` is final) -- bounded by Slurm's KillWait (after which slurmd
kills every task) plus a margin, and only then prints the final status and
the step of the last complete checkpoint. A ``resume`` typed after it never
starts beside an attempt that is still writing.

A local run is stopped by signalling its controller, and only once
``launch/local_run.py`` has proven the PID in run.json to be the run's (start
time and run token); a run whose summary is final, or whose run.json lacks
that proof, is never signalled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract.cancel_marker import write_cancel_marker
from hpctrain.contract.rundir import RUN_FILE, Summary, latest_checkpoint_step, read_run_info, read_summary, trial_dir
from hpctrain.contract.slurm import Slurm, SlurmCommandError, WaitTimedOut, checked_job_id
from hpctrain.contract.slurm_states import is_final
from hpctrain.errors import ClusterError, RunDirError
from hpctrain.launch import local_run

# Beyond KillWait: slurmd's epilog, and rank 0 writing summary.json after the checkpoint.
SETTLE_MARGIN_S = 10.0
DEFAULT_TIMEOUT_S = 60.0  # 'hpctrain cancel --timeout': time for Slurm to end the job
MAX_LOCAL_TRIALS = 1000  # a local sweep starts every trial at once on one machine: never near this


@dataclass(frozen=True)
class Cancelled:
    """Where a cancelled run stands once it settled (or the wait for it ran out).

    ``state``: the job's end as Slurm says it (or each local trial's); ``status``: the run's
    own, from its summary; ``settled``: no process of the job is left (``False``: some task
    may still be writing after ``limit_s``); ``checkpoint_step``: the last complete checkpoint.
    """

    run_dir: Path
    job_id: str
    state: str
    status: str
    settled: bool
    limit_s: float
    checkpoint_step: int | None


def cancel_run(run_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S, *, slurm: Slurm | None = None) -> Cancelled:
    """Cancel one run's job and wait until none of its processes is left; where it stands then.

    Raises ``RunDirError`` for a run.json that names no job of this run (nothing is signalled),
    ``ClusterError`` when Slurm does not end the job within ``timeout_s``.
    """
    slurm = slurm or Slurm()
    info = read_run_info(run_dir)
    job_id = str(info.get("job_id", ""))
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
    return Cancelled(run_dir, job_id, state, status, settled, limit_s, latest_checkpoint_step(run_dir))


def ended_already(run_dir: Path, *, slurm: Slurm | None = None) -> str | None:
    """Why there is nothing of the run left to cancel (its job ended and no process of it is left),
    or None when a cancel has something to do; asks before anything is written or signalled.

    A sweep's trials answer for themselves (``cancel_run`` says per trial)."""
    info = read_run_info(run_dir)
    if info.get("trials"):
        return None
    summary = read_summary(run_dir) or Summary()
    if info.get("backend") == "local":
        if summary.is_final:
            return f"its summary is final (status {summary.status})"
        return "its process is gone" if local_run.liveness(info) == "gone" else None
    job_id = str(info.get("job_id") or "")
    slurm = slurm or Slurm()
    if not job_id or not slurm.available():
        return None  # cancel_run says what is wrong with it
    state = slurm.job_state(_slurm_job_id(run_dir, job_id))
    if is_final(state) and not slurm.processes_may_run(job_id):
        return f"job {job_id} ended {state}"
    return None


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


def _slurm_job_id(run_dir: Path, job_id: str) -> str:
    """run.json's job id, refused (naming the file) unless it names exactly one Slurm job."""
    try:
        return checked_job_id(job_id)
    except SlurmCommandError as exc:
        raise RunDirError(f"{run_dir / RUN_FILE}: {exc}", hint=exc.hint) from None


def _cancel_slurm(slurm: Slurm, job_id: str, timeout_s: float) -> str:
    state = slurm.job_state(job_id)
    if is_final(state):
        return f"already ended ({state})"
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
    if local_run.valid_pid(info.get("job_id")) is None:
        raise RunDirError(
            f"{run_dir / RUN_FILE}: job_id {str(info.get('job_id'))[:40]!r} is not the process id of a local run "
            "(a whole number above 1); not signalled",
            hint="this run.json was edited or damaged; nothing was stopped",
        )
    record = local_run.parse_record(info)
    if record is None:
        if local_run.liveness(info) == "gone":
            return "already ended"
        raise RunDirError(
            f"{run_dir / RUN_FILE}: nothing proves that process {str(info.get('job_id'))[:40]!r} is this local run's "
            "(no start time and run token recorded: an older hpctrain wrote it, or it was edited); not signalled",
            hint="if the run is still going, stop it where it runs (Ctrl-C in its terminal), or check the process "
            "with 'ps -o pid,lstart,args -p PID' before killing it yourself",
        )
    if local_run.liveness(info) == "unproven":
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
