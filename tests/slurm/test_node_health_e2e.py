"""Sick nodes on a five-node cluster: burn-in takes a slow node out before training, eviction during it.

The run: 4 nodes x 1 gloo rank plus a spare, the small deterministic
ResNet-18 job (2 epochs x 12 steps, a checkpoint every 4 steps). A node is
made slow with ``slurm-cluster slow NODE --cpu-pct P``: every process in its
namespace, slurmd and its job steps included, shares P % of one core. Two
jobs share the checks (CI time):

* run A starts on a healthy cluster (its burn-in flags nobody: the false
  alarm check), n3 is slowed after its first checkpoint, and the supervisor
  evicts it and goes on with the spare; the run completes;
* run B starts with n3 slowed: the burn-in flags it, the spare replaces it
  before any training, the run completes with run A's weights (it trains
  undisturbed on 4 nodes: the same global batches, so the same weights).

Both write n3 into the workspace's bad-node ledger; the next submit's dry
run excludes it, ``hpctrain nodes`` shows the evidence. The node is slowed to
10 % of a core, not 25 %: on the shared 2-core machine a healthy rank may get
less than a quarter of a core (the 25 % detection rate is a benchmark,
``benchmarks/node_health.py``); and at 25 % run A's 24 steps end about when
the eviction comes (measured twice on 24.11: evicted both times, but 2 s
after the last step), too close for a test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hpctrain.contract.rundir import submitit_dir, summary_path

from .conftest import SCRIPT
from .hpctrain_cli import cli_env, hpctrain, make_dataset, task_logs
from .stop_helpers import Run, latest_step, wait_for, wait_no_processes

if TYPE_CHECKING:
    from .conftest import SlurmCluster

SLOW = "n3"
SLOW_PCT = 10
EPOCHS, STEPS = 2, 12
RUN_TIMEOUT_S = 420
SETS = (
    "resources.nodes=4",
    "resources.tasks_per_node=1",
    "resources.spare_nodes=1",
    "trainer.deterministic=true",
    f"trainer.epochs={EPOCHS}",
    f"trainer.max_steps_per_epoch={STEPS}",
    "trainer.batch_size=2",
    "checkpoint.every_steps=4",
    "distributed.heartbeat_interval_s=2",
    "health.burn_in.budget_s=10",
    "health.eviction.window_s=8",
    "health.eviction.min_steps=3",
)


def slow(node: str, pct: float | None) -> None:
    args = ["slow", node, "--off"] if pct is None else ["slow", node, "--cpu-pct", str(pct)]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


CLUSTER_SHAPE = "five nodes"  # conftest.py: this file runs with the others that need it, after the default's


@pytest.fixture(scope="module")
def five_nodes(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    slurm_cluster.configure(nodes=5)
    try:
        yield slurm_cluster
    finally:
        slow(SLOW, None)


@pytest.fixture(scope="module")
def workspace(five_nodes: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("node-health")
    env = cli_env(five_nodes, tmp / "state")
    data = make_dataset(env, tmp / "data", per_class=32)
    return {"env": env, "data": data, "runs": tmp / "runs"}


def sets(ws: dict[str, Any], name: str) -> list[str]:
    args = []
    for item in (f"name={name}", f"data.root={ws['data']}", f"output_dir={ws['runs']}", *SETS):
        args += ["--set", item]
    return args


def submit(ws: dict[str, Any], name: str, *flags: str) -> tuple[Run, str]:
    done = hpctrain(ws["env"], "submit", "jobs/smoke_2x2_cpu.yaml", "--json", *flags, *sets(ws, name), timeout=60)
    assert done.returncode == 0, done
    report = done.json()
    return Run(report["job_id"], Path(report["run_dir"])), done.stderr


def burn_ins(run: Run) -> list[dict[str, Any]]:
    path = summary_path(run.run_dir)
    return json.loads(path.read_text()).get("burn_in") or [] if path.exists() else []


def finished(cluster: SlurmCluster, run: Run) -> dict[str, Any]:
    try:
        state = cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S)
    except AssertionError as exc:  # what the run decided about its nodes says why
        summary = summary_path(run.run_dir).read_text() if summary_path(run.run_dir).exists() else ""
        raise AssertionError(f"{exc}\nsummary.json: {summary}") from None
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(submitit_dir(run.run_dir).glob("*_0_log.err")))
    assert state == "COMPLETED", f"{logs}\n{task_logs(run.run_dir)}"
    summary = run.summary()
    assert (summary["status"], summary["global_step"]) == ("completed", EPOCHS * STEPS), summary
    left, _ = wait_no_processes(cluster, run.job_id, timeout=60)
    assert left == [], f"processes of job {run.job_id} outlived it: {left}"
    return summary


def test_slow_nodes_are_evicted_during_training_and_kept_out_by_the_burn_in(
    five_nodes: SlurmCluster, workspace: dict[str, Any]
) -> None:
    cluster = five_nodes
    # run A: healthy start, n3 slowed mid-run, evicted
    run_a, _ = submit(workspace, "evict")
    first = wait_for(lambda: burn_ins(run_a), "the first burn-in", 180, run_a)
    assert first[0]["flagged"] == [] and first[0]["nodes"] == ["n1", "n2", "n3", "n4"], json.dumps(first)  # no alarm
    wait_for(lambda: latest_step(run_a.run_dir) >= 4, "the first checkpoint", 180, run_a)
    slow(SLOW, SLOW_PCT)
    try:
        summary_a = finished(cluster, run_a)
    finally:
        slow(SLOW, None)
    [evicted] = summary_a["evictions"]
    assert evicted["node"] == SLOW and evicted["ratio"] > 1.5 and evicted["action"] == "swap", evicted
    assert evicted["compute_kind"] == "step", evicted  # each step's own compute, not the forward alone
    assert [(e["node"], e["kind"], e["action"]) for e in summary_a["node_failures"]] == [(SLOW, "slow", "swap")]
    assert summary_a["hostnames"] == ["n1", "n2", "n4", "n5"] and summary_a["excluded_nodes"] == [SLOW]
    assert [b["flagged"] for b in summary_a["burn_in"]] == [[], []]  # the relaunch's burn-in too

    # run B: n3 slow before the start; the burn-in swaps in the spare; the same weights as run A
    slow(SLOW, SLOW_PCT)
    try:
        run_b, said = submit(workspace, "burnin")  # the ledger names n3, but the job needs all five nodes
        summary_b = finished(cluster, run_b)
    finally:
        slow(SLOW, None)
    flagged, healthy = summary_b["burn_in"]
    assert flagged["flagged"] == [SLOW] and healthy["flagged"] == [], json.dumps(summary_b["burn_in"])
    [score] = [s for s in flagged["scores"] if s["node"] == SLOW]
    assert score["reason"].startswith("compute "), score
    assert [(e["node"], e["kind"], e["action"]) for e in summary_b["node_failures"]] == [(SLOW, "burn-in", "swap")]
    assert summary_b["hostnames"] == ["n1", "n2", "n4", "n5"]
    assert f"not excluding {SLOW} (the oldest entries)" in said, said  # the list the cluster cannot satisfy
    assert summary_b["weights_sha256"] == summary_a["weights_sha256"]

    # the ledger: both runs put n3 in it; the next submit keeps the job away from it
    listed = hpctrain(workspace["env"], "nodes", "--json")
    assert [(e["node"], e["kind"]) for e in listed.json()] == [(SLOW, "slow"), (SLOW, "burn-in")], listed
    dry = hpctrain(workspace["env"], "submit", "jobs/smoke_2x2_cpu.yaml", "--dry-run", *sets(workspace, "next"))
    assert f"#SBATCH --exclude={SLOW}" in dry.stdout and f"# excluding {SLOW} (bad-node ledger: burn-in:" in dry.stdout
