"""One slow node on the two-node test cluster: the report names it as the largest loss of the step.

A 2-node ddp job (one gloo rank per node) trains 12 steps with its second node (n2) held at
10 % of a core (``slurm-cluster slow``, the quota the node-health tests use).
Its step_split records must add up to the step time the trainer measured on
its own (5 %), and ``hpctrain report --json`` must name a straggler on n2, most
of it in n2's own compute, as the largest loss. (The clean counterpart, and the
slow loader, are the local tests' ``tests/local/test_step_split.py``; a clean
study here would double this test's wall time.)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from hpctrain.contract.rundir import metrics_path
from hpctrain.contract.step_split import PARTS

from .conftest import SCRIPT
from .hpctrain_cli import cli_env, data_sets, hpctrain, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# alone (it slows a node), nothing release-specific: CI runs it on 26.05's cluster beside 24.11's alone
# half (docs/testing.md, `slurm_side`)
pytestmark = pytest.mark.slurm_side

# 12 steps (the data set's epoch: 192 images, 2 ranks x 8), a step_split record after every step: the report
# keeps 11 steady windows (the epoch's first left out). With 2 ranks, one rank the slowest in 10 or more of 11
# happens by chance about 1 time in 85, under the report's 1 in 20 (docs/scaling.md), so the slow node is named
# on that persistence alone, one window off allowed, even when the machine's load leaves its own work under
# twice the other rank's. With a record every 2 steps (5 windows, chance 1 in 16) only that margin could name
# it, and in rehearsal 35 (26.05, beside the unit tier and the scale smoke's start) it was 12 % of the step
# and not named.
SLOW_PCT, STEPS = 10, 12
SETS = (
    "resources.nodes=2",
    "resources.tasks_per_node=1",
    "trainer.epochs=1",
    f"trainer.max_steps_per_epoch={STEPS}",
    "trainer.log_every_steps=1",
    "health.burn_in.enabled=false",  # it would flag n2 before training (tests/slurm/test_node_health_e2e.py)
)


def slow(node: str, pct: float | None) -> None:
    args = ["slow", node, "--off"] if pct is None else ["slow", node, "--cpu-pct", str(pct)]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def records(run_dir: Path, kind: str) -> dict[int, dict[str, Any]]:
    lines = metrics_path(run_dir).read_text().splitlines()
    return {r["global_step"]: r for r in map(json.loads, lines) if r["kind"] == kind}


def test_a_slow_node_is_named_as_the_largest_loss(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    slow_node = slurm_cluster.nodes[1]  # n2 on instance 0, m2 on instance 1
    env = cli_env(slurm_cluster, tmp_path / "state")
    data = make_dataset(env, tmp_path / "data", per_class=48)  # 12 steps of 2 x 8 images
    slow(slow_node, SLOW_PCT)
    try:
        done, submitted = submit_json(
            env, "jobs/smoke_2x2_cpu.yaml", *data_sets(data, tmp_path / "runs", "name=split", *SETS), timeout=60
        )
        assert done.returncode == 0, done
        run_dir = Path(submitted["run_dir"])
        state = slurm_cluster.wait_state(submitted["job_id"], timeout=480)
    finally:
        slow(slow_node, None)
    assert state == "COMPLETED", task_logs(run_dir)

    splits, steps = records(run_dir, "step_split"), records(run_dir, "train_step")
    steady = [g for g in splits if g > 2]
    assert len(steady) >= 3, splits
    parts = statistics.fmean(sum(splits[g][f"{p}_s"] for p in PARTS) for g in steady)
    measured = statistics.fmean(steps[g]["step_s"] for g in steady)
    assert abs(parts / measured - 1) < 0.05, (parts, measured)

    shown = hpctrain(env, "report", str(run_dir), "--out", str(tmp_path / "report"), "--json", timeout=120)
    assert shown.returncode == 0, shown
    waterfall = json.loads(shown.stdout)["waterfall"]  # report --json prints one indented document
    text = (tmp_path / "report" / "report.md").read_text()
    assert waterfall["causes"], text
    top = waterfall["causes"][0]
    assert top["part"] == "straggler" and f"straggler {slow_node}:" in top["evidence"], text
    assert waterfall["splits"][0]["slowest_node"] == slow_node
    assert waterfall["bars"][0]["losses"][0]["part"] == "straggler", text
    assert f"straggler {slow_node}" in text
