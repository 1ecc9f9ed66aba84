"""A user's own loop, written against hpctrain.task, resumes exactly on the real cluster (issue 28).

The loop is the example of docs/your-own-loop.md (``hpctrain/examples/own_loop.py``:
plain PyTorch DDP over gloo on a generated ImageFolder; here one rank on each of 2 nodes
(stop_helpers.TASKS_PER_NODE: CI's CPU), 18 steps, a checkpoint every 2 steps), run as an ``entrypoint:``
job with each step held 0.5 s (``task_entrypoints.held_own_loop``) so that a
test can signal it between checkpoints. One uninterrupted run, shared by the
module, gives the reference:

* requeued by the time-limit signal (USR2) and then preempted by a job of the
  high-priority partition, it ends with the reference's ``weights_sha256`` bit
  for bit, every step logged once, and ``status`` and ``report`` show it;
* with ``resources.min_nodes: 1``, a node killed mid-run leaves the loop on
  the other node's rank (computing both micro-batches of each step): it ends
  with weights within 1e-3 (relative) of the reference's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from hpctrain.contract.rundir import checkpoints_dir

from .hpctrain_cli import hpctrain, task_logs
from .stop_helpers import (
    TASKS_PER_NODE,
    WORLD_SIZE,
    Run,
    Workspace,
    latest_step,
    make_workspace,
    report_timing,
    requeue_then_preempt,
    train_steps_logged,
    wait_for,
)
from .task_entrypoints import ENTRYPOINT_MODULE
from .test_node_loss_e2e import kill_node

if TYPE_CHECKING:
    from .conftest import SlurmCluster

SPEC = "jobs/own_loop_cpu.yaml"
EPOCHS, TOTAL_STEPS = 3, 18  # 64 images / (2 ranks x 2) = 16 steps per epoch; 18 steps end in epoch 2
START_TIMEOUT_S = 120  # submit -> first checkpoint: the ranks importing torch and torchvision on 2 cores
RUN_TIMEOUT_S = 240
# A node killed mid-run: srun notices at node-failure detection (SlurmdTimeout: 75-78 s with 60 s, now 30 s), then
# the supervisor continues on the survivors. A hang guard, not a timing.
NODE_LOSS_TIMEOUT_S = 360


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(slurm_cluster, tmp_path_factory.mktemp("task-api"), as_user=True)


def submit_loop(ws: Workspace, *extra_sets: str) -> Run:
    sets = [
        f"output_dir={ws.runs}",
        f"entrypoint={ENTRYPOINT_MODULE}:held_own_loop",
        f"entrypoint_args.data_root={ws.data}",
        f"entrypoint_args.epochs={EPOCHS}",
        "entrypoint_args.batch_size=2",
        f"entrypoint_args.max_steps={TOTAL_STEPS}",
        "health.ledger_days=0",  # the node this module kills must not be excluded from later tests' jobs
        f"resources.tasks_per_node={TASKS_PER_NODE}",
        *extra_sets,
    ]
    args = [item for value in sets for item in ("--set", value)]
    done = hpctrain(ws.env, "submit", SPEC, "--json", *args, timeout=60)
    assert done.returncode == 0, done
    report = done.json()
    return Run(report["job_id"], Path(report["run_dir"]))


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model of the run's newest checkpoint, loaded here in one process (written by 2 ranks or 1)."""
    from hpctrain import task
    from hpctrain.examples.own_loop import tiny_cnn

    model = tiny_cnn(4)
    assert task.Checkpointer(checkpoints_dir(run_dir), model=model).load() == TOTAL_STEPS
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


@pytest.fixture(scope="module")
def reference(slurm_cluster: SlurmCluster, workspace: Workspace) -> Run:
    """The loop trained without interruption."""
    started = time.monotonic()
    run = submit_loop(workspace, "name=own_loop_reference")
    state = slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S)
    assert state == "COMPLETED", task_logs(run.run_dir)
    summary = run.summary()
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", TOTAL_STEPS, 0), summary
    report_timing("own loop, uninterrupted", time.monotonic() - started)
    return run


def test_requeue_then_preemption_end_with_the_uninterrupted_weights(
    slurm_cluster: SlurmCluster, workspace: Workspace, reference: Run, tmp_path: Path
) -> None:
    started = time.monotonic()
    run = submit_loop(workspace, "name=own_loop_requeued")
    first_stop, second_stop = requeue_then_preempt(slurm_cluster, run, tmp_path, START_TIMEOUT_S)
    assert 2 <= first_stop < second_stop < TOTAL_STEPS, (first_stop, second_stop)
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    report_timing("own loop, requeued + preempted, submit to end", time.monotonic() - started)

    summary = run.summary()
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", TOTAL_STEPS, 2), summary
    assert summary["weights_sha256"] == reference.summary()["weights_sha256"], task_logs(run.run_dir)
    # each attempt continued at the step the last one stopped at: every step trained (and logged) once
    assert train_steps_logged(run.run_dir) == list(range(1, TOTAL_STEPS + 1))

    status = hpctrain(workspace.env, "status", str(run.run_dir), "--json")
    assert status.returncode == 0, status
    shown = status.json()
    assert (shown["status"], shown["global_step"], shown["restarts"]) == ("completed", TOTAL_STEPS, 2), shown
    watched = hpctrain(workspace.env, "status", str(run.run_dir), "--watch", timeout=60)
    assert watched.returncode == 0, watched
    assert f"global step {TOTAL_STEPS}/{TOTAL_STEPS}" in watched.stdout, watched
    assert f"checkpoint step {TOTAL_STEPS}" in watched.stdout, watched
    out = workspace.runs.parent / "report"  # the test user's folder: hpctrain runs as that user
    report = hpctrain(workspace.env, "report", str(run.run_dir), "--out", str(out), "--json", timeout=120)
    assert report.returncode == 0, report
    [row] = json.loads(report.stdout)["runs"]  # --json prints one indented document
    assert row["train_step_records"] == TOTAL_STEPS and isinstance(row["last_train_loss"], float), row
    assert row["restarts"] == 2, row


def test_a_lost_node_leaves_the_loop_on_the_survivors_within_tolerance(
    slurm_cluster: SlurmCluster, workspace: Workspace, reference: Run
) -> None:
    started = time.monotonic()
    run = submit_loop(workspace, "name=own_loop_node_lost", "resources.min_nodes=1")
    try:
        wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
        kill_node("n2")
        state = slurm_cluster.wait_state(run.job_id, timeout=NODE_LOSS_TIMEOUT_S)
        assert state == "COMPLETED", task_logs(run.run_dir)
        report_timing("own loop, node lost mid-run, submit to end", time.monotonic() - started)
        summary = run.summary()
        ours, theirs = final_weights(run.run_dir), final_weights(reference.run_dir)
    finally:
        # n2 comes back for the tests after this one: the cluster restarts, which also removes the test
        # user's home (both runs' folders), so everything is read before
        slurm_cluster.resize(len(slurm_cluster.nodes))
    survivors = WORLD_SIZE - TASKS_PER_NODE
    assert (summary["status"], summary["global_step"], summary["world_size"]) == ("completed", TOTAL_STEPS, survivors)
    [failure] = summary["node_failures"]
    assert (failure["node"], failure["action"], failure["nodes"]) == ("n2", "drop", ["n1"]), failure
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        relative = float((ours[name] - value).norm() / value.norm())
        assert relative <= 1e-3, f"{name}: {relative:.2e} from the uninterrupted run's"
    print(f"\n[weights] largest relative difference: {max_relative(ours, theirs):.2e}", flush=True)


def max_relative(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> float:
    return max(float((ours[k] - v).norm() / v.norm()) for k, v in theirs.items())
