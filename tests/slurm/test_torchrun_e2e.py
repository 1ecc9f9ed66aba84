"""``launcher: torchrun`` on the two-node cluster: one Slurm task per node runs torchrun, which starts 2 ranks.

The stop tests' gloo job (stop_helpers.py) on 2 nodes x 2 ranks (``TWO_PER_NODE``: torchrun's point
is the ranks it starts beside each other), submitted with ``--set launcher=torchrun``: the ranks come
out where srun would put them, a time-limit requeue and a preemption resume bit-identically, ``hpctrain
cancel`` leaves no process on either node, and a killed rank is named.

The requeued and preempted run also carries ``tracking.mlflow`` with
``tracking.live`` (CI time: no job of its own): a real ``mlflow server``
(SQLite) on this machine's bridge address, which the nodes reach, is fed during the run by the
sender that the node task hosting global rank 0 starts beside torchrun, at
each of the three starts; with no ``hpctrain sync`` from here it ends as ONE
MLflow run with each step once.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from submitit.core.utils import pickle_load

from hpctrain.contract.rundir import submitit_dir
from tests.tracking_helpers import mlflow_server, wait_serving

from .conftest import HOST_ADDR
from .entrypoints import ENTRYPOINT_MODULE
from .hpctrain_cli import task_logs
from .stop_helpers import (
    EPOCHS,
    STEPS_PER_EPOCH,
    TWO_PER_NODE,
    UNTIL_CANCELLED,
    WORLD_SIZE_TWO_PER_NODE,
    Workspace,
    assert_completed_exactly,
    cancel_leaves_nothing,
    cmdline_of,
    describe,
    environ_of,
    latest_step,
    make_workspace,
    parent_of,
    report_timing,
    requeue_then_preempt,
    submit,
    uninterrupted_weights,
    wait_for,
    wait_no_processes,
)
from .tracker_checks import (
    assert_live_steps_counted,
    assert_one_mlflow_run_each_step_once,
    live_mlflow_sets,
    live_state,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

TORCHRUN = ("launcher=torchrun", TWO_PER_NODE)
# The tests here leave the burn-in out (CI time: each start would pay a torch import more); a torchrun job's
# burn-in, flagging a slow node and then nobody: test_node_loss_e2e.py.
NO_BURN_IN = "health.burn_in.enabled=false"
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
START_TIMEOUT_S = 120  # submit -> first checkpoint: 2 torchruns and 4 ranks importing torch on 2 cores
RUN_TIMEOUT_S = 180
LEFTOVER_BUDGET_S = 30


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(slurm_cluster, tmp_path_factory.mktemp("torchrun"))


@pytest.fixture(scope="module")
def reference_weights(slurm_cluster: SlurmCluster, workspace: Workspace) -> str:
    """``weights_sha256`` of the srun-launched run trained without interruption (stop_helpers'
    ``uninterrupted_weights`` of the 2 x 2 shape, from the store when an earlier session trained it): a
    torchrun run, interrupted or not, must end with it, since its ranks are srun's and the launcher changes
    no arithmetic."""
    return uninterrupted_weights(slurm_cluster, workspace, RUN_TIMEOUT_S, TWO_PER_NODE)


def worker_pid(cluster: SlurmCluster, job_id: str, rank: int) -> int | None:
    """The process torchrun started for global rank ``rank`` (not its data-loader workers)."""
    found = [
        pid
        for pid in cluster.processes_with_env("SLURM_JOB_ID", job_id)
        if environ_of(pid).get("RANK") == str(rank)
        and "hpctrain.programs.torchrun_worker" in cmdline_of(pid)
        and "torch.distributed.run" in cmdline_of(parent_of(pid))  # torchrun's child, not a data-loader worker
    ]
    return found[0] if len(found) == 1 else None


@pytest.mark.slurm_contract
@pytest.mark.slurm_shared  # the preemption test is not: it preempts through `urgent`
def test_ranks_0_to_3_run_two_per_node(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    run = submit(
        workspace, *TORCHRUN, NO_BURN_IN, "name=torchrun_layout", f"entrypoint={ENTRYPOINT_MODULE}:rank_layout"
    )
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    layout = []
    for node_task in (0, 1):  # one Slurm task per node, each returning its node's ranks
        outcome, ranks = pickle_load(submitit_dir(run.run_dir) / f"{run.job_id}_{node_task}_result.pkl")
        assert outcome == "success", ranks
        layout += [(r["rank"], r["result"]["local_rank"], r["result"]["node"], r["result"]["host"]) for r in ranks]
        for r in ranks:
            result = r["result"]
            assert (result["source"], result["slurm_job_id"], result["world_size"]) == ("slurm-torchrun", run.job_id, 4)
            assert (result["torchrun_rank"], result["ranks_seen"]) == (str(r["rank"]), 4)
    n1, n2 = slurm_cluster.nodes
    assert layout == [(0, 0, n1, n1), (1, 1, n1, n1), (2, 0, n2, n2), (3, 1, n2, n2)]
    sacct = slurm_cluster.run("sacct", "-n", "-P", "-o", "JobID,NTasks", "-j", run.job_id).stdout
    assert f"{run.job_id}.0|2" in sacct.split(), f"one srun step of 2 tasks (one per node):\n{sacct}"


# alone (it preempts through `urgent`), nothing release-specific: CI runs it on 26.05's side cluster beside
# 24.11's alone half, off the critical path (docs/testing.md, `slurm_side`)
@pytest.mark.slurm_side
def test_timeout_requeue_and_preemption_resume_bit_identically(
    slurm_cluster: SlurmCluster, workspace: Workspace, reference_weights: str, tmp_path: Path
) -> None:
    pytest.importorskip("mlflow")
    started = time.monotonic()
    with mlflow_server(tmp_path / "mlflow", host=HOST_ADDR, wait=False) as uri:  # it starts while the job does
        run = submit(workspace, *TORCHRUN, NO_BURN_IN, "name=torchrun_requeued", *live_mlflow_sets(uri, "torchrun"))

        # The time-limit signal reaches every process of the step; the ranks checkpoint, rank 0 requeues.
        # Then a preemption: SIGTERM to everything, which neither the node task nor torchrun may act on.
        first_stop, _ = requeue_then_preempt(slurm_cluster, run, tmp_path, START_TIMEOUT_S)
        assert 2 <= first_stop < TOTAL_STEPS

        assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
        report_timing("torchrun: requeued + preempted run, submit to end", time.monotonic() - started)
        summary = assert_completed_exactly(run, 2, reference_weights)
        # what the torchrun reference run asserted before it was the srun one's: 4 ranks on both nodes
        assert (summary["world_size"], summary["hostnames"]) == (4, slurm_cluster.nodes), summary

        checks = time.monotonic()
        # tracking.live alone (no `hpctrain sync` from here): the last start's sender sent every step, and
        # the senders of all starts together sent each step once (a sender that found the server still
        # starting, 6-30 s here, tried again later)
        wait_serving(uri, timeout_s=5)  # up long since: the job's senders reached it
        assert live_state(run.run_dir)["through"] == {"mlflow": TOTAL_STEPS}, live_state(run.run_dir)
        assert_live_steps_counted(run.run_dir, TOTAL_STEPS)  # never twice; each step once: in MLflow, next
        tracked = assert_one_mlflow_run_each_step_once(uri, "torchrun", run.run_dir)
        tags = tracked.data.tags
        assert (tags["hpctrain.status"], tags["hpctrain.restarts"]) == ("completed", "2"), tags
        assert tracked.info.status == "FINISHED", "the node task told its sender that the run ended"
    report_timing("torchrun: MLflow checks and the server's stop", time.monotonic() - checks)


@pytest.mark.slurm_contract
@pytest.mark.slurm_shared
def test_hpctrain_cancel_leaves_no_process_on_either_node(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    # training when the cancel lands
    run = submit(workspace, *TORCHRUN, NO_BURN_IN, "name=torchrun_cancelled", UNTIL_CANCELLED)
    cancel_leaves_nothing(slurm_cluster, workspace, run, "torchrun", START_TIMEOUT_S)


@pytest.mark.slurm_shared
def test_killed_rank_fails_the_job_and_is_named(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    run = submit(workspace, *TORCHRUN, NO_BURN_IN, "name=torchrun_killed_rank")
    wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
    last = WORLD_SIZE_TWO_PER_NODE - 1  # on the second node
    pid = wait_for(lambda: worker_pid(slurm_cluster, run.job_id, last), f"rank {last}'s process", 10, run)
    os.kill(pid, signal.SIGKILL)  # as the OOM killer would
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "FAILED", task_logs(run.run_dir)
    summary = run.summary()
    failed = {key: summary.get(key) for key in ("status", "failed_rank", "failed_node")}
    named = {"status": "failed", "failed_rank": last, "failed_node": slurm_cluster.nodes[1]}
    assert failed == named, f"{summary}\n{task_logs(run.run_dir)}"
    left, _ = wait_no_processes(slurm_cluster, run.job_id, timeout=LEFTOVER_BUDGET_S)
    assert left == [], f"processes of the failed job outlived it:\n{describe(left)}"
