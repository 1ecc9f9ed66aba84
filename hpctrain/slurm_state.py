"""Ask Slurm what became of a job (sacct, falling back to squeue).

Light on purpose: login-node commands (status, cancel, submit --wait) use it.
Parsing is pure and tested on recorded ``sacct`` output.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from hpctrain.errors import ClusterError

# States after which a job will not run again by itself. REQUEUED/PREEMPTED jobs come back.
TERMINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)


def normalise_state(raw: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'; '' -> 'UNKNOWN'."""
    word = raw.strip().split(" ")[0].rstrip("+") if raw.strip() else ""
    return word or "UNKNOWN"


def parse_sacct_states(output: str) -> dict[str, str]:
    """Lines of ``sacct -X -n -P -o JobID,State`` -> {job id: state}."""
    states = {}
    for line in output.splitlines():
        if "|" not in line:
            continue
        job_id, _, state = line.partition("|")
        states[job_id.strip()] = normalise_state(state)
    return states


def _run(command: list[str], timeout: float = 30) -> str:
    if shutil.which(command[0]) is None:
        raise ClusterError(f"'{command[0]}' is not on this machine", hint="run this on a Slurm login node")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ClusterError(
            f"'{' '.join(command)}' did not answer in {timeout:.0f} s", hint="slurmctld may be busy; try again"
        ) from None
    if result.returncode != 0:
        raise ClusterError(f"'{' '.join(command)}' failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def job_state(job_id: str) -> str:
    """Current state of a job (array task ids like 12_3 work too)."""
    states = parse_sacct_states(_run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", job_id]))
    if job_id in states:
        return states[job_id]
    queued = _run(["squeue", "-h", "-o", "%T", "-j", job_id]).strip() if shutil.which("squeue") else ""
    if queued:
        return normalise_state(queued.splitlines()[0])
    return next(iter(states.values()), "UNKNOWN")


def wait_until_done(job_id: str, *, poll_s: float = 2.0, timeout_s: float | None = None) -> str:
    """Block until the job reaches a terminal state; return it."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        state = job_state(job_id)
        if state in TERMINAL_STATES:
            return state
        if deadline is not None and time.monotonic() > deadline:
            raise ClusterError(f"job {job_id} is still {state} after {timeout_s:.0f} s")
        time.sleep(poll_s)
