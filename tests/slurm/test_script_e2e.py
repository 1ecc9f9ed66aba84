"""``script:`` jobs on the two-node cluster: a user's own plain-PyTorch scripts, in each style HAL's users write.

The scripts (``scripts/``: gloo on CPU) are the styles of HAL's tutorial and
PyTorch's: torchrun's environment per rank, ``mp.spawn`` per node with a
``tcp://`` rendezvous, ``torch.distributed.launch``'s ``--local_rank``, and
torchrun itself. Each job is 2 nodes x 2 processes and checks several things
at once (CI time): where the processes ran and what they got, how a start
ended in ``summary.json``, ``status`` and ``logs``, and that every step was
trained exactly once across requeues (the script resumes from its own
``snapshot.pt`` in the run directory). Jobs run as the cluster's unprivileged
user, from a folder of its own outside git. None is in ``slurm_contract``:
what differs between Slurm versions (a preemption's requeue changed in 24.05,
the srun report, the reaper, torchrun) goes through the same code as the
trainer's (``runtime/requeue.py``), whose contract tests cover every version;
the requeue-and-preemption test passed on 22.05 and 26.05 by hand (65 s, 60 s)
and stays out of CI's side legs to keep its hour.

That requeued and preempted job also carries two trackers (no job of its own:
CI time): the script records its loss with ``hpctrain.task.log`` (after
installing its own stop handler, which the task API keeps); ``tracking.live``
sends it from rank 0's node to a real MLflow server on this machine, one MLflow
run across the three starts, each step once, FINISHED by the last start; the
W&B tracker in offline mode is one offline W&B run, read back with W&B's own
reader (wandb-core) after ``hpctrain sync`` from here, which sends nothing twice.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import submitit_dir, task_log_name, tracking_dir
from tests.tracking_helpers import mlflow_server, wait_serving

from .conftest import HOST_ADDR
from .hpctrain_cli import hpctrain, task_logs
from .script_helpers import (
    ScriptWorkspace,
    env_report,
    make_script_workspace,
    requeue_then_preempt_script,
    starts,
    steps_trained,
)
from .stop_helpers import (
    Run,
    describe,
    escapees,
    job_record,
    report_timing,
    wait_for,
    wait_no_processes,
)
from .tracker_checks import (
    LIVE_INTERVAL_S,
    assert_live_steps_counted,
    assert_one_mlflow_run_each_step_once,
    assert_one_wandb_run_each_step_once,
    live_state,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

START_TIMEOUT_S = 120  # submit -> first checkpoint: 4 processes importing torch on 2 cores
RUN_TIMEOUT_S = 180
LEFTOVER_BUDGET_S = 30
WANDB = {"project": "e2e-script", "mode": "offline"}


@pytest.fixture(scope="module")
def ws(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> ScriptWorkspace:
    return make_script_workspace(slurm_cluster, tmp_path_factory.mktemp("scripts"))


def assert_layout(run: Run, restart: int, per_rank: bool = True, job_id: str | None = None) -> None:
    """Ranks 0-3, two per node, each with torchrun's variables, hpctrain's, and its folder the run directory."""
    for rank in range(4):
        got = env_report(run.run_dir, restart, rank)
        expected = {"RANK": str(rank) if per_rank else None, "WORLD_SIZE": "4", "cwd": str(run.run_dir)}
        if per_rank:
            expected.update(LOCAL_RANK=str(rank % 2), LOCAL_WORLD_SIZE="2", GROUP_RANK=str(rank // 2))
        expected.update(HPCTRAIN_RUN_DIR=str(run.run_dir), HPCTRAIN_RESTART_COUNT=str(restart))
        expected.update(HPCTRAIN_JOB_ID=job_id or run.job_id, HPCTRAIN_STOP_SIGNAL="TERM", local_rank=rank % 2)
        assert {key: got.get(key) for key in expected} == expected, got
        assert Path(got["program"]).is_relative_to(run.run_dir / "code"), "every start runs the submitted copy"


def test_torchrun_style_script_is_requeued_and_preempted_and_resumes_from_its_own_checkpoint(
    slurm_cluster: SlurmCluster, ws: ScriptWorkspace, tmp_path: Path
) -> None:
    """The time-limit warning (USR2), then partition preemption: each time the script gets SIGTERM, saves at
    a step boundary and exits; hpctrain requeues (the warning) or Slurm does (preemption), and the next start
    resumes from the script's own checkpoint: every step is trained exactly once. The script's own stop handler
    comes before its first ``hpctrain.task`` call, which keeps it. Its ``task.log`` losses are ONE MLflow run,
    sent by ``tracking.live`` from rank 0's node alone, and ONE W&B offline run, each step once."""
    pytest.importorskip("mlflow")
    started = time.monotonic()
    args = ["--steps", "14", "--step-s", "0.5", "--task-log", "--tag", "{rank}"]
    with mlflow_server(tmp_path / "mlflow", host=HOST_ADDR, wait=False) as uri:  # it starts while the job does
        live = {"live": True, "live_interval_s": LIVE_INTERVAL_S}
        tracking = {"wandb": WANDB, "mlflow": {"tracking_uri": uri, "experiment": "script"}, **live}
        spec = ws.spec("ddp_env", {"path": "ddp_env.py", "args": args}, tracking=tracking)
        run = ws.submit(spec)
        first_stop, second_stop = requeue_then_preempt_script(slurm_cluster, run, tmp_path, START_TIMEOUT_S)
        assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
        report_timing("script: requeued + preempted run, submit to end", time.monotonic() - started)

        assert steps_trained(run.run_dir) == list(range(14)), "every step once, in order, across three starts"
        assert starts(run.run_dir) == [(0, 0), (1, first_stop), (2, second_stop)], "each start resumed where it stopped"
        assert 2 <= first_stop < second_stop < 14
        summary = run.summary()
        assert (summary["status"], summary["restarts"], summary["script"]) == (
            "completed",
            2,
            str(ws.scripts / "ddp_env.py"),
        )
        assert_layout(run, 0)
        assert_layout(run, 2)
        assert env_report(run.run_dir, 1, 3)["argv"][-1] == "3", "placeholders are filled per rank"
        out = (submitit_dir(run.run_dir) / task_log_name(run.job_id, 0, err=True)).read_text()
        assert "stopping (timeout): sent SIGTERM" in out and "stopping (preempted): sent SIGTERM" in out, out
        kept = "hpctrain.task: SIGTERM already has this process's own handler (common.on_stop_signal.<locals>.<lambda>)"
        assert kept in out, out  # and the stops above show that it ran: only the script's own flag stops it
        status = hpctrain(ws.env, "status", str(run.run_dir))
        assert "status: completed" in status.stdout and "restarts: 2" in status.stdout, status
        logs = hpctrain(ws.env, "logs", str(run.run_dir), "--rank", "3")
        assert "rank 3: completed" in logs.stdout, logs

        checks = time.monotonic()
        # tracking.live alone (the sync below comes after): rank 0's sender of the last start sent every step
        # when its task said the run ended, and the senders of all starts together each step once
        wait_serving(uri, timeout_s=5)  # up long since: the job's senders reached it
        live_log = (tracking_dir(run.run_dir) / "live.log").read_text()
        assert live_state(run.run_dir)["through"].get("mlflow") == 14, f"{live_state(run.run_dir)}\n{live_log}"
        print(f"\n[live.log]\n{live_log}", flush=True)  # W&B offline: written by the node's sender too, or later
        assert_live_steps_counted(run.run_dir, 14)  # never twice; each step once: in MLflow, next
        tracked = assert_one_mlflow_run_each_step_once(uri, "script", run.run_dir)
        tags = tracked.data.tags
        assert (tags["hpctrain.status"], tags["hpctrain.restarts"]) == ("completed", "2"), tags
        assert tracked.info.status == "FINISHED", "rank 0's task told its sender that the run ended"
        synced = hpctrain(ws.env, "sync", str(run.run_dir), "--json", timeout=180)  # as the test user, from here
        assert synced.returncode == 0, synced
        states = {state["tracker"]: state for state in json.loads(synced.stdout)}
        for tracker in ("wandb", "mlflow"):
            assert (states[tracker]["through"], states[tracker]["final"]) == (14, "completed"), states
        assert_one_wandb_run_each_step_once(run.run_dir, WANDB["project"])
        assert_one_mlflow_run_each_step_once(uri, "script", run.run_dir)  # the sync sent nothing twice
        report_timing("script: MLflow and W&B offline checks, sync and read-back", time.monotonic() - checks)


@pytest.mark.slurm_shared
def test_launch_style_script_under_torchrun_exit_3_is_named_and_resume_completes(
    slurm_cluster: SlurmCluster, ws: ScriptWorkspace
) -> None:
    """A ``torch.distributed.launch`` script (``--local_rank``) run by ``launcher: torchrun`` (launch's
    successor: one Slurm task per node starts torchrun, each rank it starts runs the script). Its rank 3 exits
    3 at step 2: the job fails at once and names rank 3 on n2 with its exit code and last lines; ``resume``
    continues from its checkpoint and completes. One job for both launchers' checks (CI time)."""
    args = ["--local_rank={local_rank}", "--steps", "6", "--fail-rank", "3", "--fail-step", "2"]
    spec = ws.spec("launch_style", {"path": "launch_local_rank.py", "args": args}, launcher="torchrun")
    run = ws.submit(spec)
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "FAILED", task_logs(run.run_dir)
    summary = run.summary()
    named = {key: summary.get(key) for key in ("status", "failed_rank", "failed_node", "failed_exit_code")}
    second = slurm_cluster.nodes[1]  # n2 on instance 0: names from the fixture, so it runs on any instance
    assert named == {"status": "failed", "failed_rank": 3, "failed_node": second, "failed_exit_code": 3}, summary
    assert "rank 3: failing on purpose at step 2" in summary["failed_stderr"], summary
    status = hpctrain(ws.env, "status", str(run.run_dir))
    assert "failed_exit_code: 3" in status.stdout and "| rank 3: failing on purpose" in status.stdout, status
    batch_log = (submitit_dir(run.run_dir) / task_log_name(run.job_id, 0, err=True)).read_text()
    assert f"the script of rank 3 on {second} failed first: it exited with code 3" in batch_log, batch_log
    left, _ = wait_no_processes(slurm_cluster, run.job_id, timeout=LEFTOVER_BUDGET_S)
    assert left == [], describe(left)

    resumed = hpctrain(ws.env, "resume", str(run.run_dir), "--wait", "--json", timeout=RUN_TIMEOUT_S + 60)
    assert resumed.returncode == 0, f"{resumed}\n{task_logs(run.run_dir)}"
    summary = run.summary()
    assert (summary["status"], summary["restarts"]) == ("completed", 1), summary
    assert "failed_rank" not in summary, "a new start forgets the last one's failure"
    assert steps_trained(run.run_dir) == list(range(6)) and starts(run.run_dir) == [(0, 0), (1, 2)]
    job_id = resumed.json()["job_id"]
    assert_layout(run, 1, job_id=job_id)
    assert all(env_report(run.run_dir, 1, rank)["TORCHELASTIC_RUN_ID"] == job_id for rank in range(4))
    logs = hpctrain(ws.env, "logs", str(run.run_dir), "--rank", "1")  # node task 1: ranks 2 and 3
    assert "[default0]:rank 2: completed" in logs.stdout and "[default1]:rank 3: completed" in logs.stdout, logs


@pytest.mark.slurm_shared
def test_mp_spawn_script_per_node_completes(slurm_cluster: SlurmCluster, ws: ScriptWorkspace) -> None:
    """HAL's multi-node style: one process per node spawns two workers, rendezvous at tcp://{master_addr}."""
    args = ["--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{nnodes}", "--rank", "{node_rank}"]
    args += ["--nproc", "{nproc_per_node}", "--steps", "4"]
    run = ws.submit(ws.spec("mp_spawn", {"path": "mp_spawn_tcp.py", "per": "node", "args": args}))
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    assert steps_trained(run.run_dir) == list(range(4))
    for node in (0, 1):
        got = env_report(run.run_dir, 0, f"node{node}")
        assert (got["RANK"], got["LOCAL_RANK"], got["WORLD_SIZE"], got["GROUP_RANK"]) == (None, None, "4", str(node))
        assert got["argv"][:6] == [
            "--dist-url",
            f"tcp://{slurm_cluster.nodes[0]}:{got['MASTER_PORT']}",
            "--world-size",
            "2",
            "--rank",
            str(node),
        ]
    assert_layout(run, 0, per_rank=False)  # the workers: their ranks are the script's own
    sacct = slurm_cluster.run("sacct", "-n", "-P", "-o", "JobID,NTasks", "-j", run.job_id).stdout
    assert f"{run.job_id}.0|2" in sacct.split(), f"one task per node:\n{sacct}"
    assert run.summary()["status"] == "completed"


@pytest.fixture
def linuxproc(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.set_proctrack("linuxproc")
    try:
        yield slurm_cluster
    finally:
        slurm_cluster.set_proctrack("cgroup")


def test_cancel_leaves_no_process_of_a_script_under_linuxproc(linuxproc: SlurmCluster, tmp_path: Path) -> None:
    """mp.spawn workers, their data-loader workers and a setsid'ed escapee per worker: after ``hpctrain cancel``
    nothing of the job is left on either node, though Slurm itself (linuxproc) would leave the escapees."""
    ws = make_script_workspace(linuxproc, tmp_path)  # the restart with linuxproc made the test user anew
    args = ["--dist-url", "tcp://{master_addr}:{master_port}", "--world-size", "{nnodes}", "--rank", "{node_rank}"]
    args += ["--nproc", "{nproc_per_node}", "--steps", "400", "--step-s", "0.5", "--loader-workers", "1", "--escape"]
    run = ws.submit(ws.spec("cancelled", {"path": "mp_spawn_tcp.py", "per": "node", "args": args}))
    wait_for(lambda: len(steps_trained(run.run_dir)) >= 2, "two steps", START_TIMEOUT_S, run)
    assert len(escapees(linuxproc, run.job_id)) == 4, "every worker left its escapee"
    started = time.monotonic()
    cancelled = hpctrain(ws.env, "cancel", str(run.run_dir), timeout=120)
    assert cancelled.returncode == 0, cancelled
    assert "the script keeps its own checkpoints" in cancelled.stdout, cancelled
    left, _ = wait_no_processes(linuxproc, run.job_id, timeout=LEFTOVER_BUDGET_S)
    report_timing("script: hpctrain cancel -> no process of the job on any node", time.monotonic() - started)
    assert left == [], f"left behind by job {run.job_id}:\n{describe(left)}"
    assert linuxproc.wait_state(run.job_id) == "CANCELLED"
    summary = run.summary()
    stopped = (summary.get("status"), summary.get("stop_reason"))
    assert stopped == ("stopped", "cancelled"), f"{cancelled}\n{summary}\n{task_logs(run.run_dir)}"
    assert int(job_record(linuxproc, run.job_id).get("Restarts", "0")) == 0
