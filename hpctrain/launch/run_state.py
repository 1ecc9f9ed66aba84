"""The run state rule: Slurm's word (or a local run's processes) about a run, reconciled with its summary.json.

A job that ended while its summary still says "running" lost rank 0 (killed,
out of memory, node failure): it is failed, with the task srun reported first;
a job that never started has Slurm's word (pending, cancelled). Every reader of
a run's state asks here: ``hpctrain status`` and ``status --watch``
(``observe/``), and the tracking wing's "has this run ended" (``tracking/sync.py``,
which the live sender runs inside the job too). It stands beside the local
run's liveness (``local_run.py``) and below every view. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import read_run_info, run_home, task_log_path
from hpctrain.contract.runfiles import read_tail
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_states import ended_unsuccessfully, is_final, is_pending, succeeded, was_cancelled
from hpctrain.contract.srun_report import first_task_failure
from hpctrain.contract.summary import Summary, parse_summary, read_summary
from hpctrain.errors import ClusterError, RunDirError
from hpctrain.launch import local_run

FAILURE_LOG_TAIL_BYTES = 4 << 20  # srun reports a failed task at the end of the batch step's log


def run_state(
    run_dir: Path, known_states: Mapping[str, str] | None = None, *, slurm: Slurm | None = None
) -> tuple[dict[str, Any], str, Summary]:
    """The run's ``run.json``, its job's state now (Slurm's, or a local run's) and its summary reconciled
    with that state; ``known_states``: job id -> Slurm state, where the caller asked already."""
    info = read_run_info(run_dir)
    recorded = read_summary(run_dir)
    job_id = str(info.get("job_id", ""))
    known = (known_states or {}).get(job_id)
    if info.get("backend") == "local":
        state = local_run.state(info, run_dir, summary_final=bool(recorded and recorded.is_final))
    else:
        state = known or slurm_state(job_id, slurm or Slurm())
    summary = parse_summary(reconcile(recorded.fields() if recorded else {}, state, run_dir)) or Summary()
    return info, state, summary


def reconcile(summary: dict[str, Any], slurm_state: str, run_dir: Path) -> dict[str, Any]:
    """A job that Slurm says has ended (or a local run whose processes are gone) but whose summary
    still says "running" lost its rank 0 (killed, out of memory, node failure): say so, and name
    the task srun reported as failed first in the batch step's log."""
    if (
        (not is_final(slurm_state) and slurm_state != local_run.GONE_STATE)
        or succeeded(slurm_state)
        or summary.get("status") not in (None, "running")
        or (summary.get("status") is None and was_cancelled(slurm_state))  # cancelled before it started
    ):
        return summary
    summary = {**summary, "status": "stopped" if was_cancelled(slurm_state) else "failed"}
    if summary.get("failed_rank") is None:
        try:
            log = task_log_path(run_dir, read_run_info(run_dir), 0, err=True)
            tail = read_tail(log, FAILURE_LOG_TAIL_BYTES, within=run_home(run_dir))
            failure = first_task_failure(tail.decode("utf-8", errors="replace"))
        except (OSError, RunDirError):
            failure = None
        if failure is not None:
            summary.update(failed_rank=failure.rank, failed_node=failure.node, failed_reason=failure.reason)
        elif slurm_state == local_run.GONE_STATE and summary.get("failed_reason") is None:
            summary["failed_reason"] = "its processes ended without recording an end (killed, e.g. out of memory)"
    return summary


def display_status(status: str | None, slurm_state: str | None) -> str | None:
    """The run's own status, or what Slurm knows when the run never started (pending, cancelled while queued)."""
    if status is not None or slurm_state is None:
        return status
    if is_pending(slurm_state):
        return "pending"
    if was_cancelled(slurm_state):
        return "cancelled"
    if ended_unsuccessfully(slurm_state) or slurm_state == local_run.GONE_STATE:
        return "failed"
    return None


def slurm_state(job_id: str, slurm: Slurm) -> str:
    """Slurm's state of ``job_id``, or ``unknown (why)`` where Slurm cannot say."""
    if not job_id or not slurm.available():
        return "unknown (no Slurm here)"
    try:
        return slurm.job_state(job_id)
    except ClusterError as exc:
        return f"unknown ({exc.message})"
