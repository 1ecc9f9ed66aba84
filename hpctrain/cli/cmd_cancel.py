"""``hpctrain cancel RUN|JOB_ID``: cancel a run so that nothing it started survives.

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
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from hpctrain import job_registry, slurm
from hpctrain.errors import ClusterError
from hpctrain.rundir import Summary, latest_checkpoint_step, read_run_info, read_summary
from hpctrain.runtime.stop import write_cancel_marker
from hpctrain.slurm import TERMINAL_STATES, job_state

# Beyond KillWait: slurmd's epilog, and rank 0 writing summary.json after the checkpoint.
SETTLE_MARGIN_S = 10.0


def run(args: argparse.Namespace) -> int:
    from hpctrain.cli import study_views

    if (study_dir := study_views.study_dir_of(args.run)) is not None:
        return study_views.cancel(study_dir, args.timeout)
    return cancel_run(job_registry.resolve_run(args.run), args.timeout)


def cancel_run(run_dir: Path, timeout_s: float) -> int:
    """Cancel one run's job, wait until none of its processes is left, print where it stands."""
    info = read_run_info(run_dir)
    job_id = str(info.get("job_id", ""))
    write_cancel_marker(run_dir, [job_id])
    if info.get("backend") == "local":
        state = _cancel_local(job_id, timeout_s)
        summary, settled = read_summary(run_dir) or Summary(), True
    else:
        state = _cancel_slurm(job_id, timeout_s)
        limit_s = slurm.kill_wait_s() + SETTLE_MARGIN_S
        summary, settled = wait_to_settle(run_dir, lambda: slurm.processes_may_run(job_id), limit_s)
    step = latest_checkpoint_step(run_dir)
    status = summary.status or "unknown"
    if settled and not summary.is_final and summary.status is not None:
        status = f"stopped (the job ended before the run recorded it; its summary still says {summary.status})"
    print(f"job {job_id}: {state}; run status: {status}")
    if not settled:
        print(
            f"warning: {limit_s:.0f} s after the cancel, some task of job {job_id} may still be writing; "
            f"check 'hpctrain status {run_dir}' before resuming"
        )
    if step is None:
        print(f"no checkpoint was written; 'hpctrain resume {run_dir}' starts it again from the beginning")
    else:
        print(f"last complete checkpoint: step {step}; 'hpctrain resume {run_dir}' continues from it")
    return 0


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


def _cancel_slurm(job_id: str, timeout_s: float) -> str:
    state = job_state(job_id)
    if state in TERMINAL_STATES:
        return f"already ended ({state})"
    slurm.cancel_job(job_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state in TERMINAL_STATES:
            return state
        time.sleep(1.0)
    raise ClusterError(
        f"job {job_id} is still {state} {timeout_s:.0f} s after scancel",
        hint="a node may be unresponsive; ask the admins, or check 'scontrol show job " + job_id + "'",
    )


def _cancel_local(job_id: str, timeout_s: float) -> str:
    """Local jobs: job id is the pid of submitit's local controller."""
    try:
        pid = int(job_id)
        os.kill(pid, signal.SIGTERM)
    except (ValueError, ProcessLookupError):
        return "already ended"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "CANCELLED"
        time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    return "CANCELLED (killed)"
