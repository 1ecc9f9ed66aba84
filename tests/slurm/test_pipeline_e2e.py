"""strategy: pipeline on the Slurm test cluster: jobs/pipeline_2stage_cpu.yaml, one stage per node
(activations cross the nodes over gloo), trains, validates and leaves a whole-model checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torchvision

from hpctrain.contract.rundir import checkpoints_dir, summary_path
from hpctrain.trainer.checkpoint import CheckpointManager

from .hpctrain_cli import cli_env, data_sets, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared


def test_two_stage_pipeline_trains_across_two_nodes(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    tmp = tmp_path_factory.mktemp("pipeline_e2e")
    env = cli_env(slurm_cluster, tmp / "state")
    data = make_dataset(env, tmp / "data")
    spec = "jobs/pipeline_2stage_cpu.yaml"
    submitted, report = submit_json(env, spec, *data_sets(data, tmp / "runs"), "--wait", timeout=300)
    run_dir = Path(report["run_dir"])
    assert submitted.returncode == 0, f"{submitted}\n{task_logs(run_dir)}"
    assert slurm_cluster.wait_state(report["job_id"]) == "COMPLETED"

    summary = json.loads(summary_path(run_dir).read_text())
    shape = {key: summary.get(key) for key in ("status", "strategy", "world_size", "hostnames", "epochs_completed")}
    assert shape == {
        "status": "completed",
        "strategy": "pipeline",
        "world_size": 2,
        "hostnames": ["n1", "n2"],
        "epochs_completed": 2,
    }, summary
    assert summary["global_step"] == 8 and summary["val_loss"] is not None

    state = CheckpointManager(checkpoints_dir(run_dir)).load()
    model = torchvision.models.resnet18(num_classes=4)
    model.load_state_dict(state["model"])  # the whole model, torchvision's keys
    assert len(state["pipeline"]) == 2
