"""``hpctrain sync`` of a real Slurm run into a real MLflow server: one MLflow run for a run that was
requeued (USR2, the time-limit signal), preempted (a job of the urgent partition) and lost a node mid-run
(healed onto the spare), each optimizer step once, with metrics.jsonl's last value of it; the restarts and
the lost node visible.

The MLflow server runs on this machine, as on a login node, at its address on the nodes' bridge (the
nodes have network namespaces of their own); with ``tracking.live`` global rank 0's node also runs the
sender beside the trainer: the senders of the starts and the login side's syncs together send each step
once.
The training run is the stop tests' small job (2 nodes x 1 gloo rank, 3 epochs x 6 steps, a
checkpoint every 2 steps) with ``resources.spare_nodes: 1`` on the three-node cluster.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import metrics_path
from tests.tracking_helpers import last_values, mlflow_server

from .conftest import HOST_ADDR
from .hpctrain_cli import hpctrain, task_logs
from .stop_helpers import (
    EPOCHS,
    STEPS_PER_EPOCH,
    Workspace,
    latest_step,
    make_workspace,
    preempt,
    stop_lines,
    submit,
    wait_for,
    wait_requeued,
)
from .test_node_loss_e2e import kill_node
from .tracker_checks import assert_live_steps_counted, live_state

if TYPE_CHECKING:
    from .conftest import SlurmCluster

mlflow = pytest.importorskip("mlflow")
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 300


CLUSTER_SHAPE = "three nodes"  # conftest.py: this file runs with the others that need it, after the default's


@pytest.fixture(scope="module")
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    slurm_cluster.configure(nodes=3)
    return slurm_cluster


@pytest.fixture(scope="module")
def workspace(cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(cluster, tmp_path_factory.mktemp("tracking"))


# alone (it preempts and kills a node); on 24.11's alone half again since CI #53, whose side stream ended ~500 s
# after 24.11's legs (docs/testing.md, `slurm_side`)
def test_a_requeued_run_that_loses_a_node_is_one_mlflow_run_with_each_step_once(
    cluster: SlurmCluster, workspace: Workspace, tmp_path: Path
) -> None:
    with mlflow_server(tmp_path / "mlflow", host=HOST_ADDR) as uri:
        run = submit(
            workspace, "name=tracked", "resources.spare_nodes=1", "health.burn_in.enabled=false",
            f"tracking.mlflow.tracking_uri={uri}", "tracking.mlflow.experiment=e2e",
            "tracking.live=true", "tracking.live_interval_s=5",
        )  # fmt: skip
        info = json.loads((run.run_dir / "run.json").read_text())
        wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
        cluster.run("scancel", "--signal=USR2", run.job_id)
        wait_requeued(cluster, run.job_id, restarts=1, run=run)
        first_stop = latest_step(run.run_dir)
        cluster.release(run.job_id)

        early = hpctrain(workspace.env, "sync", str(run.run_dir), "--json")  # while it is requeued: settled steps
        assert early.returncode == 0, early
        [state] = json.loads(early.stdout)
        assert state["through"] <= first_stop and state["final"] is None, state

        wait_for(
            lambda: latest_step(run.run_dir) > first_stop, "a checkpoint of the second start", START_TIMEOUT_S, run
        )
        preemptor = preempt(cluster, tmp_path)  # the urgent partition's job takes two of the three nodes
        wait_requeued(cluster, run.job_id, restarts=2, timeout=90, run=run)
        second_stop = latest_step(run.run_dir)
        cluster.release(run.job_id)
        assert cluster.wait_state(preemptor, timeout=60) == "COMPLETED"
        wait_for(
            lambda: latest_step(run.run_dir) > second_stop, "a checkpoint of the third start", START_TIMEOUT_S, run
        )
        # a step logged past the latest checkpoint, so the start after the loss is likely to redo it
        wait_for(lambda: max(last_values(metrics_path(run.run_dir)), default=-1) > latest_step(run.run_dir),
                 "a step past the checkpoint", START_TIMEOUT_S, run, poll_s=0.02)  # fmt: skip
        lost = cluster.nodes[1]  # n2 on instance 0: names from the fixture, so it runs on any instance
        kill_node(lost)
        assert cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
        summary = run.summary()
        assert summary["status"] == "completed" and summary["global_step"] == TOTAL_STEPS, summary
        assert [failure["node"] for failure in summary["node_failures"]] == [lost], summary

        # the last start's sender (rank 0's task told it the run ended) sent every step and the run's end
        assert live_state(run.run_dir)["through"] == {"mlflow": TOTAL_STEPS}, live_state(run.run_dir)
        client = mlflow.tracking.MlflowClient(uri)
        [tracked] = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
        assert tracked.info.status == "FINISHED", "tracking.live sent the run's end"
        done = hpctrain(workspace.env, "sync", str(run.run_dir), "--json")
        assert done.returncode == 0, done
        [finished] = json.loads(done.stdout)
        assert (finished["through"], finished["final"]) == (TOTAL_STEPS, "completed"), finished
        # rank 0's node sent steps too (tracking.live, beside the trainer): together, each step once (in MLflow,
        # below); the counts never count a step twice, and may miss the steps of a sync whose sender was
        # killed after its cursor recorded them (here: the node loss, or KillWait's SIGKILL after a requeue)
        assert_live_steps_counted(run.run_dir, TOTAL_STEPS, others=state["sent"] + finished["sent"])
        again = hpctrain(workspace.env, "sync", str(run.run_dir), "--json")
        assert json.loads(again.stdout)[0]["sent"] == 0

        experiment = client.get_experiment_by_name("e2e")
        [tracked] = client.search_runs([experiment.experiment_id])  # ONE run for every start of the job
        assert tracked.data.tags["hpctrain.tracking_id"] == info["tracking_id"]
        history = client.get_metric_history(tracked.info.run_id, "train/loss")
        expected = last_values(metrics_path(run.run_dir))
        logged = Counter(record["global_step"] for record in map(json.loads, metrics_path(run.run_dir).open())
                         if record.get("kind") == "train_step")  # fmt: skip
        assert sorted(expected) == list(range(1, TOTAL_STEPS + 1))
        twice = sorted(step for step, count in Counter(m.step for m in history).items() if count > 1)
        assert not twice, sent_twice(run.run_dir, history, twice)
        assert sorted(m.step for m in history) == sorted(expected), "each optimizer step exactly once"
        assert {m.step: m.value for m in history} == expected, "the value of the start that kept the step"
        tags = tracked.data.tags
        assert tags["hpctrain.lost_nodes"] == lost and tags["hpctrain.status"] == "completed", tags
        assert int(tags["hpctrain.restarts"]) >= 2, tags  # the requeue's start, the preemption's (and the heal's)
        assert [line.split(")")[0] for line in stop_lines(run)] == ["stopping (timeout", "stopping (preempted"]
        restarts = client.get_metric_history(tracked.info.run_id, "hpctrain/restart")
        numbers = sorted(m.value for m in restarts)  # each start after the first, at its first step, once
        assert numbers == [float(n) for n in range(1, int(tags["hpctrain.restarts"]) + 1)], restarts
        assert [m.step for m in client.get_metric_history(tracked.info.run_id, "hpctrain/node_lost")] == [
            summary["node_failures"][0]["step"]
        ]
        redone = sorted(step for step, count in logged.items() if count > 1)  # a race with the checkpoint decides
        marked = client.get_metric_history(tracked.info.run_id, "hpctrain/redone_steps")
        assert sum(m.value for m in marked) == len(redone), (marked, logged)  # each redo marked at its step
        assert tracked.info.status == "FINISHED" and tracked.data.params["resources.spare_nodes"] == "1"


def sent_twice(run_dir: Path, history: list, steps: list[int]) -> str:
    """What a failure of "each step once" needs: the tracker's values and times of those steps, the metric
    lines that logged them, the starts and the sender's log."""
    lines = [line for line in metrics_path(run_dir).read_text().splitlines()
             if json.loads(line).get("kind") == "train_step" and json.loads(line)["global_step"] in steps]  # fmt: skip
    held = [(m.step, m.value, m.timestamp) for m in history if m.step in steps]
    parts = [f"steps sent twice: {steps}", f"in MLflow (step, value, ms): {held}", "metrics.jsonl:", *lines]
    for name in (".hpctrain/starts.jsonl", ".hpctrain/tracking/live.log", ".hpctrain/tracking/mlflow.json"):
        path = run_dir / name
        parts.append(f"===== {name}\n" + (path.read_text(errors="replace")[-6000:] if path.is_file() else "(none)"))
    return "\n".join(parts) + "\n" + task_logs(run_dir)
