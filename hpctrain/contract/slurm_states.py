"""What a Slurm job state means for a run: the one table every module reads.

Slurm reports some thirty job states (``squeue -o %T``, ``sacct -o State``,
``scontrol show job``'s ``JobState``), a few with a suffix ("CANCELLED by
1000", "FAILED+"). hpctrain needs to know only where the run stands, so each
state maps to one :data:`RunState`; the questions callers ask (is the job
over? may its processes still run? did it end well?) are functions of that
mapping. Code compares run states or calls these helpers, never state names.

A state this table does not know (a newer Slurm) means "unknown": not final,
so a wait keeps waiting and a cancel keeps checking rather than declaring the
run over.
"""

from __future__ import annotations

from typing import Literal

RunState = Literal["pending", "running", "ending", "finished-ok", "finished-failed", "cancelled", "unknown"]

# Slurm state -> run state. Sources: squeue(1) "JOB STATE CODES", slurm/slurm.h job_state_string().
SLURM_STATES: dict[str, RunState] = {
    # Waiting to run, or waiting to run again: the job comes back by itself.
    "PENDING": "pending",
    "PLANNED": "pending",  # 23.02+: the backfill scheduler has planned a start time
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",  # requeued by the federation
    "REQUEUE_HOLD": "pending",  # requeued and held (scontrol requeuehold)
    "SPECIAL_EXIT": "pending",  # requeued and held after a special exit code
    "RESV_DEL_HOLD": "pending",  # held because its reservation was deleted
    # Allocated: some process of the job may run now (or resume: SUSPENDED/STOPPED).
    "CONFIGURING": "running",  # nodes are booting
    "POWER_UP_NODE": "running",
    "RUNNING": "running",
    "RESIZING": "running",
    "SIGNALING": "running",
    "SUSPENDED": "running",
    "STOPPED": "running",
    # Over, but slurmd still waits for its tasks to exit (at most KillWait): it may yet be requeued.
    "COMPLETING": "ending",
    "STAGE_OUT": "ending",
    # Over for good.
    "COMPLETED": "finished-ok",
    "FAILED": "finished-failed",
    "TIMEOUT": "finished-failed",
    "NODE_FAIL": "finished-failed",
    "OUT_OF_MEMORY": "finished-failed",
    "BOOT_FAIL": "finished-failed",
    "DEADLINE": "finished-failed",
    "CANCELLED": "cancelled",
    # Ended by a preemption that did not requeue it: PreemptMode=CANCEL, or a job without its requeue flag --
    # hpctrain takes it away when a run has ended (Slurm 24.05+ would otherwise start it once more). Stopped
    # by the cluster, like a cancel. sacct shows it for a moment also while a preempted job is requeued, so
    # contract.slurm.job_state asks squeue then (runtime/requeue.py, docs/preemption.md).
    "PREEMPTED": "cancelled",
    # Transient or elsewhere: this cluster cannot say how the job ends.
    "LAUNCH_FAILED": "unknown",  # Slurm decides next whether to requeue it
    "UPDATE_DB": "unknown",
    "REVOKED": "unknown",  # a federation sibling; the job runs on another cluster
    "UNKNOWN": "unknown",
}

FINAL_RUN_STATES: frozenset[RunState] = frozenset({"finished-ok", "finished-failed", "cancelled"})

# States after which a job will not run again by itself.
TERMINAL_STATES = frozenset(state for state, run in SLURM_STATES.items() if run in FINAL_RUN_STATES)
# States in which some process of the job may still run.
ACTIVE_STATES = frozenset(state for state, run in SLURM_STATES.items() if run in ("running", "ending"))


def normalise_state(raw: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'; 'FAILED+' -> 'FAILED'; '' -> 'UNKNOWN'."""
    word = raw.strip().split(" ")[0].rstrip("+") if raw.strip() else ""
    return word or "UNKNOWN"


def run_state(slurm_state: str) -> RunState:
    """Where a run stands, from its job's Slurm state (raw or normalised). Pure."""
    return SLURM_STATES.get(normalise_state(slurm_state), "unknown")


def is_final(slurm_state: str) -> bool:
    """The job is over and will not run again by itself."""
    return run_state(slurm_state) in FINAL_RUN_STATES


def is_pending(slurm_state: str) -> bool:
    """The job waits to run (for the first time or again after a requeue)."""
    return run_state(slurm_state) == "pending"


def is_running(slurm_state: str) -> bool:
    """The job holds its nodes and has not ended (booting, running, suspended)."""
    return run_state(slurm_state) == "running"


def succeeded(slurm_state: str) -> bool:
    """The job ended with exit code 0."""
    return run_state(slurm_state) == "finished-ok"


def was_cancelled(slurm_state: str) -> bool:
    return run_state(slurm_state) == "cancelled"


def ended_unsuccessfully(slurm_state: str) -> bool:
    """The job is over and did not complete: failed, timed out, lost its node, or was cancelled."""
    return run_state(slurm_state) in ("finished-failed", "cancelled")


def may_have_processes(slurm_state: str) -> bool:
    """Some process of the job may still be alive in this state."""
    return run_state(slurm_state) in ("running", "ending")
