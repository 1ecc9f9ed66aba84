"""Time limits, preemption, failures and resume of a real training run on the two-node cluster.

All tests train the same small deterministic job (2 gloo ranks, one on each of 2 nodes,
3 epochs x 6 steps, a checkpoint every 2 steps; see stop_helpers.py). One
uninterrupted run of it, shared by the module, gives the weights that every
interrupted-and-resumed run must end with, bit for bit.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import submitit_dir

from .hpctrain_cli import hpctrain, task_logs
from .setup_hold import BATCH_HOLD_SCRIPT, HOLD_VAR
from .stop_entrypoints import ENTRYPOINT_MODULE
from .stop_helpers import (
    BURN_IN,
    EPOCHS,
    LAST_RANK,
    SMOKE_SPEC,
    STEPS_PER_EPOCH,
    WORLD_SIZE,
    Run,
    Workspace,
    a_step_logged,
    assert_completed_exactly,
    checkpoint_steps,
    job_record,
    latest_step,
    make_workspace,
    preempt,
    rank_pid,
    report_timing,
    resume_points,
    stop_lines,
    submit,
    temp_checkpoint_dirs,
    train_steps_logged,
    uninterrupted_weights,
    wait_files,
    wait_for,
    wait_no_processes,
    wait_requeued,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
START_TIMEOUT_S = 90  # submit -> first checkpoint: the ranks importing torch on 2 cores
RUN_TIMEOUT_S = 150
# A shared test's `resume --wait`: the resumed job may wait in the queue behind the other test file's job for up to
# that job's own run (116 s in rehearsal 31, on a slow machine), then runs its own.
RESUME_WAIT_S = 2 * RUN_TIMEOUT_S + 30  # the other job's run, then its own
# A dead rank must end the whole job this fast, not after a collective timeout.
FAILURE_BUDGET_S = 120
# The test cluster's GraceTime of the preemptible partition (slurm-cluster up --grace-time): a preempted job
# that stops in time is requeued well before it; later, Slurm requeues it itself.
GRACE_TIME_S = 60
# The first-seconds test trains one epoch of this many steps: what it checks happens before and after training.
SHORT_RUN_STEPS = 2


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(slurm_cluster, tmp_path_factory.mktemp("preemption"), as_user=True)


@pytest.fixture(scope="module")
def reference_weights(slurm_cluster: SlurmCluster, workspace: Workspace) -> str:
    """``weights_sha256`` of the run trained without interruption (same spec, same world size)."""
    return uninterrupted_weights(slurm_cluster, workspace, RUN_TIMEOUT_S)


@pytest.mark.slurm_contract
def test_requeue_then_preemption_resumes_bit_identically(
    slurm_cluster: SlurmCluster, workspace: Workspace, reference_weights: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    run = submit(workspace, "name=requeued_and_preempted", BURN_IN)  # each start's burn-in changes no weight

    # 1. The time-limit signal, as Slurm sends it: the job checkpoints and requeues itself.
    wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
    slurm_cluster.run("scancel", "--signal=USR2", run.job_id)
    requeue_s = wait_requeued(slurm_cluster, run.job_id, restarts=1)
    first_stop = latest_step(run.run_dir)
    assert 2 <= first_stop < TOTAL_STEPS, checkpoint_steps(run.run_dir)
    slurm_cluster.release(run.job_id)

    # 2. A job in the high-priority partition takes both nodes: SIGTERM; rank 0 requeues at once.
    wait_for(lambda: latest_step(run.run_dir) > first_stop, "a checkpoint of the second attempt", START_TIMEOUT_S, run)
    preemptor = preempt(slurm_cluster, tmp_path)
    preempt_s = wait_requeued(slurm_cluster, run.job_id, restarts=2, timeout=90)
    second_stop = latest_step(run.run_dir)
    slurm_cluster.release(run.job_id)
    assert slurm_cluster.wait_state(preemptor, timeout=60) == "COMPLETED"

    # 3. The third attempt finishes the run.
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    report_timing(f"USR2 -> job requeued (stopped at step {first_stop})", requeue_s)
    report_timing(f"preemptor submitted -> job requeued (stopped at step {second_stop})", preempt_s)
    report_timing("requeued + preempted run, submit to end", time.monotonic() - started)

    # Each attempt continued exactly at the step where the previous one stopped: none repeated, none skipped.
    assert_completed_exactly(run, 2, reference_weights)
    out = (submitit_dir(run.run_dir) / f"{run.job_id}_0_log.out").read_text()
    assert "stopping (timeout)" in out and "stopping (preempted)" in out, out


@pytest.mark.slurm_contract
@pytest.mark.slurm_shared
def test_cancel_settles_before_it_returns_and_an_immediate_resume_continues_exactly(
    slurm_cluster: SlurmCluster, workspace: Workspace, reference_weights: str
) -> None:
    """``cancel`` used to return while the ranks were still writing the stop
    checkpoint (global step 4 at return, 7 ten seconds later); a ``resume``
    typed then would start a new attempt beside the one still writing.

    The run is the reference's 18 steps (the resume must end on its weights), which end 10-20 s after
    the first step; under CI's load a CLI call takes 5-7 s to start, and ``cancel`` after a ``resume``
    refused at the first checkpoint lost the race to the run's own end (3 of 3 on 22.05, two at a time:
    "run status: completed"). So ``resume`` is refused while the job starts, and the cancel is sent as
    soon as the first step is logged."""
    run = submit(workspace, "name=cancel_then_resume")
    assert slurm_cluster.wait_state(run.job_id, ("RUNNING",), timeout=START_TIMEOUT_S) == "RUNNING"
    refused = hpctrain(workspace.env, "resume", str(run.run_dir))
    assert refused.returncode == 2 and "still RUNNING" in refused.stderr, refused
    wait_for(lambda: a_step_logged(run.run_dir), "the first step", START_TIMEOUT_S, run)

    started = time.monotonic()
    cancelled = hpctrain(workspace.env, "cancel", str(run.run_dir), timeout=120)
    report_timing("hpctrain cancel -> returned with the run settled", time.monotonic() - started)
    assert cancelled.returncode == 0, cancelled
    summary = run.summary()  # as it was the moment cancel returned
    assert (summary.get("status"), summary.get("stop_reason")) == ("stopped", "cancelled"), f"{cancelled}\n{summary}"
    assert "run status: stopped" in cancelled.stdout, cancelled
    assert f"last complete checkpoint: step {summary['global_step']}" in cancelled.stdout, cancelled
    assert latest_step(run.run_dir) == summary["global_step"]
    assert temp_checkpoint_dirs(run.run_dir) == []

    resumed = hpctrain(workspace.env, "resume", str(run.run_dir), "--wait", "--json", timeout=RESUME_WAIT_S)
    assert resumed.returncode == 0, f"{resumed}\n{task_logs(run.run_dir)}"
    final = run.summary()
    assert (final["status"], final["global_step"], final["restarts"]) == ("completed", TOTAL_STEPS, 1), final
    assert train_steps_logged(run.run_dir) == list(range(1, TOTAL_STEPS + 1)), "no step repeated or skipped"
    assert final["weights_sha256"] == reference_weights, task_logs(run.run_dir)


@pytest.mark.slurm_contract
@pytest.mark.slurm_shared
def test_killed_rank_fails_the_job_and_is_named(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    run = submit(workspace, "name=killed_rank")
    wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
    # the last rank, on the second node: not the batch step's, nor rank 0 (its own test: mid-checkpoint)
    pid = wait_for(lambda: rank_pid(slurm_cluster, run.job_id, LAST_RANK), f"rank {LAST_RANK}'s process", 10, run)

    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)  # as the OOM killer would
    state = slurm_cluster.wait_state(run.job_id, timeout=FAILURE_BUDGET_S)
    ended_s = time.monotonic() - killed
    report_timing(f"kill -9 of rank {LAST_RANK} -> job ended", ended_s)

    assert state == "FAILED", task_logs(run.run_dir)
    exit_code = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "ExitCode", "-j", run.job_id).stdout.strip()
    assert exit_code != "0:0", exit_code
    summary = run.summary()
    failed = {key: summary.get(key) for key in ("status", "failed_rank", "failed_node")}
    named = {"status": "failed", "failed_rank": LAST_RANK, "failed_node": slurm_cluster.nodes[1]}
    assert failed == named, f"{summary}\n{task_logs(run.run_dir)}"
    leftovers, _ = wait_no_processes(slurm_cluster, run.job_id, timeout=30)
    assert leftovers == [], "processes of the failed job outlived it"


@pytest.mark.slurm_shared
def test_rank0_killed_mid_checkpoint_resumes_from_previous(
    slurm_cluster: SlurmCluster, workspace: Workspace, reference_weights: str
) -> None:
    run = submit(
        workspace,
        "name=killed_mid_checkpoint",
        f"entrypoint={ENTRYPOINT_MODULE}:train_holding_checkpoint",
        "entrypoint_args.hold_step=4",
    )
    # Rank 0 has written step 4 into its temp directory and holds it there.
    temp = wait_for(lambda: temp_checkpoint_dirs(run.run_dir, step=4), "the temp dir of step 4", START_TIMEOUT_S, run)
    assert checkpoint_steps(run.run_dir) == [2], checkpoint_steps(run.run_dir)
    pid = wait_for(lambda: rank_pid(slurm_cluster, run.job_id, 0), "rank 0's process", 10, run)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert slurm_cluster.wait_state(run.job_id, timeout=FAILURE_BUDGET_S) == "FAILED", task_logs(run.run_dir)
    report_timing("kill -9 of rank 0 mid-checkpoint -> job ended", time.monotonic() - killed)
    assert [p.name for p in temp_checkpoint_dirs(run.run_dir)] == [temp[0].name], "the partial write stays behind"

    resumed = hpctrain(workspace.env, "resume", str(run.run_dir), "--wait", "--json", timeout=RESUME_WAIT_S)
    assert resumed.returncode == 0, f"{resumed}\n{task_logs(run.run_dir)}"
    new_job = resumed.json()["job_id"]
    assert new_job != run.job_id
    assert slurm_cluster.wait_state(new_job) == "COMPLETED"

    summary = run.summary()
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", TOTAL_STEPS, 1), summary
    assert resume_points(run.run_dir) == [2], "the resumed job must continue from step 2, the last complete checkpoint"
    assert temp_checkpoint_dirs(run.run_dir) == [], "the resumed run sweeps the partial write away"
    assert summary["weights_sha256"] == reference_weights, task_logs(run.run_dir)


def test_rehearse_proves_the_job_resumes(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    started = time.monotonic()
    rehearsal = hpctrain(
        workspace.env, "rehearse", SMOKE_SPEC, *workspace.sets("name=rehearsal"), "--timeout", "240", timeout=300
    )
    report_timing("hpctrain rehearse", time.monotonic() - started)
    # on a failure, every rank's last lines: the CI rehearsal of 2026-11-29 saw this job end by the hang
    # watchdog (exit 87) 100 s after its USR2, the stop checkpoint never written, once in six runs
    runs = sorted(workspace.runs.glob("rehearsal/*"))
    assert rehearsal.returncode == 0, f"{rehearsal}\n" + "\n".join(task_logs(run) for run in runs)
    assert "requeued and resumed" in rehearsal.stdout, rehearsal
    assert "rehearsal passed" in rehearsal.stdout, rehearsal
    report = rehearsal.json()
    assert report["resumed_from_step"] >= 2, rehearsal
    # It cancels the rehearsal job (or the job finished first): nothing of it keeps running.
    assert slurm_cluster.wait_state(report["job_id"], timeout=60) in ("CANCELLED", "COMPLETED")
    assert int(job_record(slurm_cluster, report["job_id"]).get("Restarts", "1")) >= 1
    assert Run(report["job_id"], Path(report["run_dir"])).summary()["restarts"] >= 1


HOLD_ENTRYPOINT = "tests.slurm.setup_hold:train"


@pytest.mark.slurm_contract
def test_stops_in_the_first_seconds_train_nothing_and_a_completed_run_never_starts_again(
    slurm_cluster: SlurmCluster, workspace: Workspace, tmp_path: Path
) -> None:
    """Issue 30: a preemption 9 s into a start was dropped ("Bypassing signal SIGTERM"), the run trained
    on until GraceTime ended, and Slurm 24.05+ started the *finished* run once more (restarts 3 for 2 stops).

    Every task holds while it imports the entry point (setup_hold.py), the moment the signal was lost.
    Start 1 gets the time-limit signal there, start 2 a preemption: each stops before training, saves
    nothing, and the job comes back (start 2 within its grace time). Start 3 trains the whole (short) run
    and is preempted in its last seconds: it completes, and Slurm does not start it again (22.05 ends it
    COMPLETED; 24.05+ PREEMPTED, its requeue flag taken away).
    """
    holds = slurm_cluster.user_dir("holds")
    started = time.monotonic()
    run = submit(
        workspace,
        "name=first_seconds",
        BURN_IN,  # every start as a user's: the burn-in's seconds before the set-up the signals come in
        f"entrypoint={HOLD_ENTRYPOINT}",
        "entrypoint_args.hold_after_start=2",
        f"env.{HOLD_VAR}={holds}",
        "trainer.epochs=1",
        f"trainer.max_steps_per_epoch={SHORT_RUN_STEPS}",
    )

    # Start 1: the time-limit warning while every task is still in its set-up.
    wait_files(holds, "holding-0-", WORLD_SIZE, "every task holding in its set-up (start 1)", START_TIMEOUT_S, run)
    slurm_cluster.run("scancel", "--signal=USR2", run.job_id)
    requeue_s = wait_requeued(slurm_cluster, run.job_id, restarts=1, timeout=90)
    assert [p.read_text() for p in sorted(holds.glob("heard-0-*"))] == ["SIGUSR2"] * WORLD_SIZE
    assert checkpoint_steps(run.run_dir) == [], "a stop before training saves nothing"
    slurm_cluster.release(run.job_id)

    # Start 2: a job of the high-priority partition takes both nodes while the tasks are in their set-up.
    wait_files(holds, "holding-1-", WORLD_SIZE, "every task holding in its set-up (start 2)", START_TIMEOUT_S, run)
    (holds / "release-2").touch()  # start 3 will not hold in its set-up
    preemptor = preempt(slurm_cluster, tmp_path)
    preempt_s = wait_requeued(slurm_cluster, run.job_id, restarts=2, timeout=GRACE_TIME_S)
    assert [p.read_text() for p in sorted(holds.glob("heard-1-*"))] == ["SIGTERM"] * WORLD_SIZE
    assert checkpoint_steps(run.run_dir) == []
    slurm_cluster.release(run.job_id)
    assert slurm_cluster.wait_state(preemptor, timeout=60) == "COMPLETED"

    # Start 3 trains every step, then is preempted in its last seconds (it holds there until it hears).
    wait_files(holds, "trained-2-", WORLD_SIZE, "every rank done training (start 3)", RUN_TIMEOUT_S, run)
    last_preemptor = preempt(slurm_cluster, tmp_path)
    wait_files(holds, "heard-2-", WORLD_SIZE, "every rank hearing the preemption (start 3)", 60, run)
    expected_end = "COMPLETED" if slurm_cluster.slurm == "22.05" else "PREEMPTED"
    assert slurm_cluster.wait_state(run.job_id, timeout=GRACE_TIME_S) == expected_end, task_logs(run.run_dir)
    assert slurm_cluster.wait_state(last_preemptor, timeout=60) == "COMPLETED"
    record = job_record(slurm_cluster, run.job_id)  # slurmctld's own word: not requeued, not pending
    assert (record.get("JobState"), record.get("Restarts")) == (expected_end, "2"), record
    report_timing("USR2 during set-up -> job requeued", requeue_s)
    report_timing("preemptor submitted during set-up -> job requeued", preempt_s)
    report_timing("three starts, two stops in the first seconds, submit to end", time.monotonic() - started)

    summary = run.summary()  # restarts 2 for 2 stops; start 3 trained every step, once, from the start
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", SHORT_RUN_STEPS, 2)
    assert train_steps_logged(run.run_dir) == list(range(1, SHORT_RUN_STEPS + 1))
    assert stop_lines(run) == [
        "stopping (timeout) before training: the stop came during set-up; nothing new to save",
        "stopping (preempted) before training: the stop came during set-up; nothing new to save",
    ]
    shown = hpctrain(workspace.env, "status", str(run.run_dir), "--json")
    assert shown.returncode == 0 and shown.json()["status"] == "completed", shown


def test_a_preemption_before_the_tasks_exist_is_not_lost(
    slurm_cluster: SlurmCluster, workspace: Workspace, tmp_path: Path
) -> None:
    """A preemption signals only a job's steps: one sent while the batch script's set-up runs reaches no
    task. Rank 0 asks Slurm (PreemptTime) before training, so the job still stops and comes back."""
    holds = slurm_cluster.user_dir("batch-holds")
    (holds / "batch_hold.sh").write_text(BATCH_HOLD_SCRIPT)
    (holds / "batch-hold-0").touch()
    run = submit(
        workspace,
        "name=preempted_before_tasks",
        f"entrypoint={HOLD_ENTRYPOINT}",
        f"env.{HOLD_VAR}={holds}",
        f'setup=["bash {holds}/batch_hold.sh"]',
    )
    wait_for(lambda: (holds / "batch-holding-0").exists(), "the batch script holding in its set-up", 60, run)
    preemptor = preempt(slurm_cluster, tmp_path)
    wait_for(lambda: job_record(slurm_cluster, run.job_id).get("PreemptTime", "None") != "None", "PreemptTime", 30)
    (holds / "release-0").touch()  # the tasks do not hold: nothing would reach them anyway
    (holds / "batch-release-0").touch()
    preempt_s = wait_requeued(slurm_cluster, run.job_id, restarts=1, timeout=GRACE_TIME_S)
    assert not list(holds.glob("heard-0-*")), "no task heard a signal: the preemption came before they existed"
    assert checkpoint_steps(run.run_dir) == []
    assert stop_lines(run) == ["stopping (preempted) before training: the stop came during set-up; nothing new to save"]
    slurm_cluster.run("scancel", run.job_id)
    assert slurm_cluster.wait_state(preemptor, timeout=60) == "COMPLETED"
    report_timing("preempted before the tasks existed -> job requeued", preempt_s)
