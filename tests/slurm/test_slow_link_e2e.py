"""One slow link on the three-node test cluster: the report names it, on its node, as the largest loss.

A 3-node ddp job (one gloo rank per node) runs its burn-in and trains a few
steps while the second node's link is limited to :data:`RATE` both ways
(``slurm-cluster slow-link``: tc tbf on both ends of its veth). Every rank's
all-reduce then runs at that link's pace, so the step shows exposed
communication on all ranks, not one straggler; what pins it on the node is
the burn-in's pairwise all-reduce (that node is slow in both of its pairs,
the other two have a fast pair left). The burn-in's network margin is set
out of reach so that it records the rates and lets the node train (its
flagging is tests/slurm/test_node_health_e2e.py's); ``hpctrain report --json``
must then name a slow link on that node as the largest loss, quoting the
burn-in's rates. Three nodes, because two share their one pair: neither end
could be named (tests/unit/test_observe_report_links.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .conftest import SCRIPT
from .hpctrain_cli import cli_env, data_sets, hpctrain, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

CLUSTER_SHAPE = "three nodes"  # conftest.py: this file runs with the others that need it, after the default's
# alone (it slows a link of the cluster). Not slurm_side since 2026-11-30: with the contract tests off 24.11,
# its ~40 s balance 24.11's alone half against the side stream (docs/testing.md)

RATE = "400mbit"  # resnet18's 44 MB of gradients: ~1 s of all-reduce per step at this rate, vs ~0.1 s unlimited
STEPS = 6
SETS = (
    "resources.nodes=3",
    "resources.tasks_per_node=1",
    "trainer.epochs=1",
    f"trainer.max_steps_per_epoch={STEPS}",
    "trainer.log_every_steps=2",
    "health.burn_in.budget_s=6",
    "health.burn_in.network_margin=100",  # record the rates, flag no link (the report's to name)
    "health.eviction.enabled=false",
)


@pytest.fixture(scope="module")
def three_nodes(slurm_cluster: SlurmCluster) -> SlurmCluster:
    slurm_cluster.configure(nodes=3)
    return slurm_cluster


def slow_link(node: str, rate: str | None) -> None:
    args = ["slow-link", node, "--off"] if rate is None else ["slow-link", node, "--rate", rate]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_slow_link_is_named_on_its_node_as_the_largest_loss(three_nodes: SlurmCluster, tmp_path: Path) -> None:
    slow = three_nodes.nodes[1]
    env = cli_env(three_nodes, tmp_path / "state")
    data = make_dataset(env, tmp_path / "data", per_class=36)  # 6 steps of 3 x 8 images
    try:
        slow_link(slow, RATE)  # inside: a limit set on one end before the other failed is removed too
        done, submitted = submit_json(
            env, "jobs/smoke_2x2_cpu.yaml", *data_sets(data, tmp_path / "runs", "name=link", *SETS), timeout=60
        )
        assert done.returncode == 0, done
        run_dir = Path(submitted["run_dir"])
        state = three_nodes.wait_state(submitted["job_id"], timeout=480)
    finally:
        slow_link(slow, None)
    assert state == "COMPLETED", task_logs(run_dir)

    shown = hpctrain(env, "report", str(run_dir), "--out", str(tmp_path / "report"), "--json", timeout=120)
    assert shown.returncode == 0, shown
    waterfall = json.loads(shown.stdout)["waterfall"]
    text = (tmp_path / "report" / "report.md").read_text()
    print(text)  # the measured numbers, for the test log
    assert waterfall["causes"], text
    top = waterfall["causes"][0]
    assert top["part"] == "link" and top["nodes"] == [slow], text
    assert f"{slow}'s best pairwise all-reduce ran at" in top["evidence"], text
    assert waterfall["bars"][0]["losses"][0]["part"] == "comm", text
    assert f"exposed communication (slow link {slow})" in text
