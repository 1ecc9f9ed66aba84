"""A rehearsal (``hpctrain rehearse SPEC``): prove a setup survives a time limit before the real run.

Submits the job, waits for its first complete checkpoint, sends the
time-limit signal (``scancel --signal=USR2``, exactly what Slurm sends
``signal_delay_s`` before the limit), releases Slurm's hold on the requeued
job, and waits until the run reports a restart that resumed from the
checkpoint. Then it cancels the rehearsal (or leaves it running with
``--set`` of your choice and ``hpctrain resume``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hpctrain.contract import rundir
from hpctrain.contract.cancel_marker import write_cancel_marker
from hpctrain.contract.checkpoint_listing import latest_checkpoint_step
from hpctrain.contract.slurm import Slurm, WaitTimedOut
from hpctrain.contract.slurm_states import is_final, is_pending
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.errors import ClusterError
from hpctrain.jobspec.load import LoadedJob
from hpctrain.launch.submission import submit_run


@dataclass(frozen=True)
class Rehearsed:
    """A passed rehearsal: its job (cancelled by then), run directory, and the step it resumed from."""

    job_id: str
    run_dir: Path
    resumed_from_step: int | None


T = TypeVar("T")


def rehearse(job: LoadedJob, timeout_s: float, say: Callable[[str], None], *, slurm: Slurm | None = None) -> Rehearsed:
    """Submit ``job``, force one time-limit requeue after its first checkpoint, check that it resumed,
    then cancel it; ``say`` hears each step. ``ClusterError`` when a step fails or ``timeout_s`` runs out."""
    if job.profile.scheduler != "slurm" or job.is_sweep:
        raise ClusterError(
            "rehearse needs a single (non-sweep) job on a Slurm cluster profile",
            hint="use the spec you will submit for real",
        )
    slurm = slurm or Slurm()
    submitted = submit_run(job)
    job_id, run_dir = submitted.job_id, submitted.run_dir
    deadline = time.monotonic() + timeout_s
    say(f"rehearsal job {job_id}, run dir {run_dir}")

    signal_name = job.spec.signals.timeout_signal
    if job.spec.script is not None:  # its checkpoints are its own: the first file it writes into the run
        saved = _wait_for(slurm, lambda state: script_saved(run_dir), job_id, deadline, "a first file the script saves")
        say(f"1/3 the script saved {saved}; sending {signal_name} as Slurm does before the time limit")
        first = None
    else:
        first = _wait_for(slurm, lambda state: latest_checkpoint_step(run_dir), job_id, deadline, "a first checkpoint")
        say(f"1/3 checkpoint at step {first}; sending {signal_name} as Slurm does before the time limit")
    slurm.signal_job(job_id, signal_name)
    stopped_at: list[int | None] = [first]  # refined once the requeued job is seen pending

    def restarted(state: str) -> Summary | None:
        summary = read_summary(run_dir) or Summary()
        if is_pending(state):  # requeued and held: its newest checkpoint is the stop checkpoint
            stopped_at[0] = latest_checkpoint_step(run_dir)
            try:
                slurm.release_job(job_id)
            except ClusterError:
                pass  # it may have started meanwhile; the next poll looks again
        resumed = (summary.restarts or 0) >= 1 and summary.status in ("running", "completed")
        return summary if resumed else None

    summary = _wait_for(slurm, restarted, job_id, deadline, "the requeued job to resume")
    if job.spec.script is not None:
        say(
            f"2/3 the script stopped, the job was requeued and the script started again (restart "
            f"{summary.restarts}); what it resumed from is its own: see its log (hpctrain logs {run_dir})"
        )
    else:
        say(
            f"2/3 stopped at step {stopped_at[0]}, requeued and resumed: restarts {summary.restarts}, "
            f"global step now {summary.global_step}"
        )
    write_cancel_marker(run_dir, [job_id])
    try:
        slurm.cancel_job(job_id)
    except ClusterError as exc:
        say(f"note: could not cancel the rehearsal job {job_id}: {exc.message}")
    return Rehearsed(job_id, run_dir, stopped_at[0])


# What hpctrain itself writes into a run directory (contract/rundir.py): anything else the script wrote.
OWN_ENTRIES = frozenset(
    {rundir.SPEC_FILE, rundir.RUN_FILE, rundir.SUMMARY_FILE, rundir.METRICS_FILE, rundir.SUBMITIT_DIR, rundir.CODE_DIR}
    | {rundir.CONTROL_DIR, rundir.HEARTBEATS_DIR, rundir.STACKS_DIR, rundir.TB_DIR, rundir.CHECKPOINTS_DIR}
    | {rundir.REPORT_DIR}
)


def script_saved(run_dir: Path) -> str | None:
    """The first file a script job wrote into its run directory (its working directory) or its checkpoint
    folder, by name; None while there is none."""
    for folder in (run_dir, rundir.checkpoints_dir(run_dir)):
        try:
            names = sorted(entry.name for entry in folder.iterdir() if entry.name not in OWN_ENTRIES)
        except OSError:
            continue
        names = [name for name in names if not name.startswith(".")]  # a temp file is not saved yet
        if names:
            return str((folder / names[0]).relative_to(run_dir))
    return None


def _wait_for(slurm: Slurm, probe: Callable[[str], T | None], job_id: str, deadline: float, what: str) -> T:
    """``probe(state)``'s first answer that is not None, asked after each of Slurm's answers about the job;
    a ``ClusterError`` when the job ends first, or at ``deadline``."""
    found: list[T] = []

    def seen(state: str) -> bool:
        value = probe(state)
        if value is not None:
            found.append(value)
        return bool(found) or is_final(state)

    try:
        state = slurm.wait_for(job_id, until=seen, timeout_s=max(0.0, deadline - time.monotonic()))
    except WaitTimedOut:
        raise ClusterError(
            f"timed out waiting for {what}", hint="raise --timeout, or check 'hpctrain status'"
        ) from None
    if not found:
        raise ClusterError(
            f"rehearsal job {job_id} ended {state} before {what}", hint=f"see its logs: hpctrain logs {job_id} --err"
        )
    return found[0]
