"""What a task does after the trainer stopped early: requeue, wait for Slurm, or finish.

The trainer saves a mid-epoch checkpoint and returns ``{"status": "stopped",
"stop_reason": ...}``; the launcher then calls :func:`finish_after_stop` on
every rank, with the process group still up.

Decision (:func:`decide_after_stop`, pure, the same on every rank):

* ``timeout`` (the ``--signal=USR2@N`` warning) -> ``requeue-self``: global
  rank 0 runs ``scontrol requeue <id>`` (``TaskEnv.job_id``: ``<array>_<task>``
  for array tasks, like submitit's ``JobEnvironment.job_id``; the commands
  themselves are ``hpctrain.contract.slurm``'s);
* ``preempted`` (SIGTERM, no cancel marker) -> ``slurm-requeues``: with
  ``PreemptMode=REQUEUE`` slurmctld requeues the job itself once GraceTime is
  over; rank 0 may do it sooner (below);
* ``cancelled``, ``requeue_on_timeout``/``requeue_on_preemption`` off,
  ``max_requeues`` spent, or not under Slurm -> ``stop``.

What Slurm 22.05 does (measured on the test cluster, and in
``src/interfaces/preempt.c::slurm_job_preempt``): a preempted job gets
SIGCONT+SIGTERM, and is requeued only when the scheduler next looks at it
after GraceTime *and it is still running* (then SIGCONT+SIGTERM again, then
SIGKILL after KillWait). A job that exits during its grace time simply ends
COMPLETED and is never requeued. ``scontrol requeue`` during the grace time
requeues at once and the preemptor starts at once. ``scontrol requeue`` on a
job that ``scancel`` is ending (COMPLETING) *revives* it. Hence rank 0 looks
at the job (``scontrol show job``: JobState, PreemptTime, Restarts) before it
requeues anything.

Slurm 24.05 changed this (SchedMD commit a689104, "Treat jobs completing
after being signalled for GraceTime as preempted"; measured on 24.11.5 and
26.05.5): the preemption's SIGTERM also sets a job flag, and a job whose
batch script ends while that flag is set is requeued by Slurm at once
(``PreemptMode=REQUEUE``) and the flag cleared. Only that path clears it: a
job requeued by ``scontrol requeue`` during the grace time, or by Slurm at
its end, keeps the flag, and its *next* run is requeued once more when it
completes (``requeue ... per user/system request``), or ends PREEMPTED
instead of COMPLETED. So from 24.05 on rank 0 does not requeue a preempting
job: every rank exits and Slurm requeues it (:data:`GRACE_EXIT_REQUEUES_FROM`).

Nothing clears that flag but such a requeue (``GRACE_PREEMPT`` in
``slurmctld/proc_req.c`` and ``job_mgr.c``, 24.05 to 26.05; no ``scontrol``
option shows or clears it), so a *finished* run could be started once more:
a whole allocation for nothing. The requeue needs the job's ``Requeue`` flag,
though, so whenever a job's tasks end for good, global rank 0 sets
``Requeue=0`` (:func:`keep_ended`); Slurm then ends the job (state PREEMPTED
where the flag was set) instead of starting it again. A start of a job whose
run the same job completed ends at once all the same (:func:`completed_by`).

Exit protocol, from submitit 1.5.4's source:

* ``submitit/core/submission.py::process_job`` loads ``<id>_submitted.pkl``,
  installs ``JobEnvironment._handle_signals`` (replaced by ours, see stop.py),
  calls the launcher, and writes ``<id>_<rank>_result.pkl`` only when the
  launcher *returns* ("success") or *raises an Exception* ("error"). A result
  file is what makes ``Job.done()`` true (``core/core.py::Job.done``).
* submitit's own requeue (``job_environment.py::SignalHandler.
  checkpoint_and_try_requeue`` -> ``SlurmJobEnvironment._requeue``) runs
  ``scontrol requeue`` on rank 0 and then ``sys.exit(-1)``: no result file,
  and the requeued job's fresh ``process_job`` re-reads the same
  ``_submitted.pkl``. We do the same, minus ``_checkpoint``'s re-pickling: the
  ``TaskLauncher`` is unchanged; the resume state is the run's checkpoints.

So every rank, after one all-reduce of rank 0's outcome:

* **finish** (``stop`` decision; a cancel marker; the job already ending
  without a requeue -- scancel, time limit; a bare ``scancel --signal=TERM``):
  return; the launcher returns the trainer's result, submitit writes it.
* **exit** (rank 0 requeued the job, or Slurm already did): ``os._exit(0)``,
  never returning to submitit, so no result file is written for a job that
  is coming back. ``os._exit``, not ``sys.exit``: interpreter shutdown can
  hang in NCCL or data-loader teardown, and slurmctld has recorded the
  requeue when ``scontrol`` returns. Status 0 keeps ``--kill-on-bad-exit`` quiet.
* **wait** (a preemption rank 0 could not speed up, or could not look at):
  stay alive until Slurm ends the job -- the next SIGTERM, which comes after
  slurmctld requeued it, or SIGKILL -- then ``os._exit(0)``.
* **fail** (the time-out requeue failed): every rank raises ``ClusterError``;
  the job FAILS with the reason, the checkpoint stays for ``hpctrain resume``.

Nothing here imports torch.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Literal

from hpctrain.contract import slurm_states
from hpctrain.contract.slurm import Runner, Slurm, SlurmCommandError
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.errors import ClusterError
from hpctrain.jobspec.models import Signals
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.stop import StopReason, StopRequest, all_reduce_max

Decision = Literal["requeue-self", "slurm-requeues", "stop"]
JobPhase = Literal["running", "preempting", "requeued", "ended", "unknown"]

SCONTROL_TIMEOUT_S = 60.0
# From this Slurm release on, a job that ends during its preemption grace time is requeued by Slurm.
GRACE_EXIT_REQUEUES_FROM = (24, 5)
REQUEUE_ATTEMPTS = 3
REQUEUE_RETRY_DELAY_S = 2.0
# Rank 0's outcome, shared by an all-reduce MAX: other ranks send EXIT (0).
EXIT, WAIT, FINISH, FAIL = 0, 1, 2, 3

log = logging.getLogger(__name__)


def job_phase(record: Mapping[str, str], restart_count: int) -> JobPhase:
    """Where the job is, from this task's point of view. Pure.

    ``restart_count`` is this run's SLURM_RESTART_COUNT: a higher Restarts
    means the job was requeued already, whatever its state shows meanwhile
    (COMPLETING hides whether the job ends or comes back).
    """
    state = record.get("JobState")
    if not state:
        return "unknown"
    restarts = record.get("Restarts", "")
    if restarts.isdigit() and int(restarts) > restart_count:
        return "requeued"
    if slurm_states.is_running(state):
        preempt_time = record.get("PreemptTime", "None")
        return "running" if preempt_time in ("None", "Unknown", "") else "preempting"
    if slurm_states.is_pending(state):
        return "requeued"
    return "ended"


def show_job(job_id: str, *, run: Runner = subprocess.run) -> dict[str, str]:
    """This job's record from slurmctld; empty when it cannot be had (never raises)."""
    if not job_id:
        return {}
    try:
        return Slurm(run).show_job(job_id, timeout_s=SCONTROL_TIMEOUT_S)
    except ClusterError as exc:
        log.warning("could not look at the job: %s", exc)
        return {}


def slurm_stop_reason(env: TaskEnv, *, run: Runner = subprocess.run) -> StopReason | None:
    """The reason "preempted" when Slurm already preempts, requeues or ends this job; else None.

    A preemption signals only the job's steps: one sent while the batch script's set-up ran,
    or while srun was starting the tasks, reached no task. Global rank 0 asks once per start,
    before training; Slurm unreachable means None (never a reason to stop).
    """
    phase = job_phase(show_job(env.slurm_job_id, run=run), env.restart_count)
    if phase in ("preempting", "requeued", "ended"):
        log.info("Slurm says the job is %s before training started", phase)
        return "preempted"
    return None


def keep_ended(env: TaskEnv, *, run: Runner = subprocess.run) -> None:
    """The tasks end for good: global rank 0 sets ``Requeue=0`` so Slurm never starts the job again.

    Slurm 24.05+ requeues a job that ends while it holds a preemption's flag, also a stale one
    (the module docstring); without the job's requeue flag it ends it instead. Failing to say so
    costs at most one more start, which :func:`completed_by` ends at once: a warning.
    """
    if not (env.is_main and env.under_slurm):
        return
    try:
        Slurm(run).disable_requeue(env.slurm_job_id, timeout_s=SCONTROL_TIMEOUT_S)
    except ClusterError as exc:
        log.warning("could not keep Slurm from starting the ended job again: %s", exc)


def completed_by(run_dir: Path, job_ids: Collection[str]) -> Summary | None:
    """The run's summary if this very job (any of ``job_ids``, e.g. ``TaskEnv.job_aliases``) completed
    the run: a start Slurm should not have made; else None.

    Another job (``hpctrain resume``) is never refused here: the summary names the job that wrote it.
    """
    summary = read_summary(run_dir)  # None when missing or unreadable: no proof of anything
    if summary is None or summary.status != "completed" or not summary.job_id:
        return None
    return summary if summary.job_id in job_ids else None


def requeue_job(
    job_id: str,
    *,
    run: Runner = subprocess.run,
    restart_count: int = 0,
    attempts: int = REQUEUE_ATTEMPTS,
    retry_delay_s: float | None = None,
) -> None:
    """Put this job back into the queue; raise ``ClusterError`` if Slurm refuses.

    Retries a busy controller. Before a retry it looks whether an earlier
    attempt went through after all (Restarts above ``restart_count``, the
    task's SLURM_RESTART_COUNT): requeueing twice would be harmless, reviving
    a job that meanwhile ended would not.
    """
    if not job_id:
        raise ClusterError("this task is not running in a Slurm job, so it cannot requeue")
    delay_s = REQUEUE_RETRY_DELAY_S if retry_delay_s is None else retry_delay_s
    problem = ""
    for attempt in range(1, attempts + 1):
        if attempt > 1:
            time.sleep(delay_s * (attempt - 1))
            phase = job_phase(show_job(job_id, run=run), restart_count)
            if phase == "requeued":
                log.info("Slurm job %s was requeued by an earlier attempt", job_id)
                return
            if phase == "ended":
                problem += "; meanwhile the job ended, so it was not requeued"
                break
        try:
            Slurm(run).requeue_job(job_id, timeout_s=SCONTROL_TIMEOUT_S)
        except SlurmCommandError as exc:
            if exc.kind == "missing":
                raise ClusterError(
                    "'scontrol' is not on this compute node's PATH, so the job cannot requeue itself",
                    hint="load the Slurm module in the spec's 'setup' lines, or set signals.requeue_on_timeout: false",
                ) from None
            problem = exc.message
        else:
            log.info("requeued Slurm job %s", job_id)
            return
        log.warning("requeue attempt %d/%d: %s", attempt, attempts, problem)
    raise ClusterError(
        f"{problem}. The checkpoint is saved, but the job could not requeue itself",
        hint="resume the run by hand ('hpctrain resume RUN_DIR'); if Slurm says requeue is disabled, "
        "the cluster runs with JobRequeue=0: submit with --requeue (hpctrain does when a requeue_on_* is on)",
    )


def decide_after_stop(
    reason: StopReason, env: TaskEnv, signals: Signals, restarts_so_far: int | None = None
) -> Decision:
    """What the job does after its ranks agreed to stop for ``reason``. Pure.

    ``restarts_so_far`` defaults to the task's SLURM_RESTART_COUNT, which counts
    every requeue of this job (time-outs, preemptions, node failures).
    """
    restarts = env.restart_count if restarts_so_far is None else restarts_so_far
    if reason == "cancelled" or not env.under_slurm or restarts >= signals.max_requeues:
        return "stop"
    if reason == "timeout":
        return "requeue-self" if signals.requeue_on_timeout else "stop"
    if reason == "preempted":
        return "slurm-requeues" if signals.requeue_on_preemption else "stop"
    raise ValueError(f"unknown stop reason {reason!r}")


def rank_zero_action(
    decision: Decision,
    phase: JobPhase,
    cancel_requested: bool,
    slurm_version: tuple[int, int] | None = None,
) -> Literal["requeue", "exit", "wait", "finish"]:
    """What rank 0 does for ``decision`` given where the job is. Pure.

    Requeue only a job that is still running: never one being cancelled,
    ended by its time limit, or already requeued. ``slurm_version`` matters
    only while the job is preempting (see the module docstring); unknown
    means "before 24.05".
    """
    if decision == "stop" or cancel_requested or phase == "ended":
        return "finish"
    if phase == "requeued":
        return "exit"
    if phase == "preempting" and slurm_version is not None and slurm_version >= GRACE_EXIT_REQUEUES_FROM:
        return "exit"  # Slurm requeues a job that ends in its grace time; requeueing it ourselves would not
    if decision == "requeue-self":
        return "requeue"  # running, preempting, or unknown: scontrol will say if it cannot
    if phase == "preempting":
        return "requeue"  # sooner than Slurm would at the end of GraceTime
    if phase == "running":
        return "finish"  # a bare SIGTERM sent by hand: neither a preemption nor a time-out
    return "wait"


def finish_after_stop(
    reason: StopReason,
    env: TaskEnv,
    signals: Signals,
    stop: StopRequest,
    *,
    agree: Callable[[int], int] = all_reduce_max,
    run: Runner = subprocess.run,
    exit_process: Callable[[int], object] = os._exit,
    max_wait_s: float | None = None,
    poll_s: float = 0.2,
) -> Decision:
    """Carry out :func:`decide_after_stop` on every rank (all must call it).

    Returns (the decision) only when the job should finish: the launcher then
    returns the trainer's result. Otherwise the process ends here without
    returning to submitit (see the module docstring). ``max_wait_s`` bounds a
    wait for Slurm's kill (default: until killed). The keyword arguments
    exist for tests.
    """
    decision = decide_after_stop(reason, env, signals)
    log.info("stop reason %s, restart %d of at most %d: %s", reason, env.restart_count, signals.max_requeues, decision)
    if decision == "stop":
        return decision
    outcome, problem = _rank_zero_outcome(decision, env, stop, run) if env.is_main else (EXIT, None)
    try:
        shared = agree(outcome)
    except Exception as exc:  # the process group may be gone; rank 0 still knows
        log.warning("could not share the outcome with the other ranks: %s", exc)
        shared = outcome if env.is_main else WAIT
    if shared == FINISH:
        return "stop"
    if shared == FAIL:
        raise problem or ClusterError(
            "global rank 0 could not requeue the job (its log says why)",
            hint="resume the run by hand: 'hpctrain resume RUN_DIR'",
        )
    if shared == WAIT:
        _wait_for_termination(stop, stop.term_signals, max_wait_s, poll_s)
    _flush_logs()
    exit_process(0)
    return decision


def _rank_zero_outcome(
    decision: Decision, env: TaskEnv, stop: StopRequest, run: Runner
) -> tuple[int, ClusterError | None]:
    cancel = stop.cancel_requested()
    phase: JobPhase = "unknown" if cancel else job_phase(show_job(env.slurm_job_id, run=run), env.restart_count)
    version = Slurm(run).client_version() if phase == "preempting" else None
    action = rank_zero_action(decision, phase, cancel, version)
    shown = f" (Slurm {version[0]}.{version[1]:02d})" if version else ""
    log.info("job is %s%s%s: %s", phase, shown, " and being cancelled" if cancel else "", action)
    if action != "requeue":
        return {"exit": EXIT, "wait": WAIT, "finish": FINISH}[action], None
    try:
        requeue_job(env.slurm_job_id, run=run, restart_count=env.restart_count)
    except ClusterError as exc:
        if decision == "slurm-requeues":  # Slurm still requeues it when GraceTime is over
            log.warning("%s; waiting for Slurm to requeue the job", exc)
            return WAIT, None
        log.error("%s", exc)
        return FAIL, exc
    return EXIT, None


def _wait_for_termination(stop: StopRequest, seen: int, max_wait_s: float | None, poll_s: float) -> None:
    """Sleep until one more SIGTERM arrives (Slurm is ending the job), or ``max_wait_s``."""
    log.info("waiting for Slurm to end the job (it requeues it when GraceTime is over)")
    _flush_logs()
    deadline = None if max_wait_s is None else time.monotonic() + max_wait_s
    while stop.term_signals <= seen:
        if deadline is not None and time.monotonic() >= deadline:
            log.warning("Slurm did not end the job within %.0f s; exiting", max_wait_s)
            return
        time.sleep(poll_s)


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers + logging.getLogger("submitit").handlers:
        try:
            handler.flush()
        except Exception:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
