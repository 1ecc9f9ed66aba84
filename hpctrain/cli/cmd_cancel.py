"""``hpctrain cancel RUN|JOB_ID``: cancel a run so that nothing it started survives.

Order matters: the cancel marker goes into the run directory *before*
``scancel``, so the tasks read the SIGTERM that follows as a cancel (save,
stop, never requeue) rather than a preemption. Slurm then signals every task;
each task's clean-up watcher ends whatever the task started, data-loader
workers and anything that called setsid included, also where Slurm's
``proctrack/linuxproc`` would leave them running (docs/preemption.md).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time

from hpctrain import job_registry
from hpctrain.errors import ClusterError
from hpctrain.rundir import read_run_info, read_summary
from hpctrain.runtime.stop import write_cancel_marker
from hpctrain.slurm import TERMINAL_STATES, job_state


def run(args: argparse.Namespace) -> int:
    run_dir = job_registry.resolve_run(args.run)
    info = read_run_info(run_dir)
    job_id = str(info.get("job_id", ""))
    write_cancel_marker(run_dir, [job_id])
    if info.get("backend") == "local":
        state = _cancel_local(job_id, args.timeout)
    else:
        state = _cancel_slurm(job_id, args.timeout)
    summary = read_summary(run_dir) or {}
    print(f"job {job_id}: {state}; run status: {summary.get('status', 'unknown')}")
    print(f"its last checkpoint stays valid: 'hpctrain resume {run_dir}' continues it")
    return 0


def _cancel_slurm(job_id: str, timeout_s: float) -> str:
    state = job_state(job_id)
    if state in TERMINAL_STATES:
        return f"already ended ({state})"
    result = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise ClusterError(f"scancel {job_id} failed: {result.stderr.strip()}")
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
