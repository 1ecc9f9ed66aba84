"""The built-in trainer end to end: a real dataset, ``hpctrain submit --wait``, then status and logs.

One small job (4 gloo ranks on 2 nodes, 2 epochs of a few steps on 32 px
images) is shared by the tests of this module; each checks one thing a user
would look at afterwards.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import metrics_path, submitit_dir, summary_path

from .hpctrain_cli import CliResult, cli_env, data_sets, hpctrain, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"


@dataclass
class TrainedRun:
    env: dict[str, str]
    submitted: CliResult
    job_id: str
    run_dir: Path

    def check_submitted(self) -> None:
        assert self.submitted.returncode == 0, f"{self.submitted}\n{task_logs(self.run_dir)}"


@pytest.fixture(scope="module")
def trained_run(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    tmp = tmp_path_factory.mktemp("trainer_e2e")
    env = cli_env(slurm_cluster, tmp / "state")
    data = make_dataset(env, tmp / "data")
    submitted, report = submit_json(env, SMOKE_SPEC, *data_sets(data, tmp / "runs"), "--wait", timeout=300)
    return TrainedRun(env, submitted, report["job_id"], Path(report["run_dir"]))


def test_smoke_job_trains_on_two_nodes(slurm_cluster: SlurmCluster, trained_run: TrainedRun) -> None:
    trained_run.check_submitted()
    run_dir = trained_run.run_dir
    assert slurm_cluster.wait_state(trained_run.job_id) == "COMPLETED"

    summary = json.loads(summary_path(run_dir).read_text())
    shape = {key: summary.get(key) for key in ("status", "world_size", "num_nodes", "hostnames", "epochs_completed")}
    assert shape == {
        "status": "completed",
        "world_size": 4,
        "num_nodes": 2,
        "hostnames": ["n1", "n2"],
        "epochs_completed": 2,
    }, summary

    metrics = [json.loads(line) for line in metrics_path(run_dir).read_text().splitlines() if line.strip()]
    assert metrics, "metrics.jsonl is empty"
    steps = sorted(run_dir.glob("checkpoints/step-*"))
    assert steps, f"no checkpoint under {run_dir / 'checkpoints'}"
    assert all((step / "meta.json").is_file() for step in steps), steps


def test_status_and_logs_of_the_finished_run(trained_run: TrainedRun) -> None:
    trained_run.check_submitted()
    env, run_dir, job_id = trained_run.env, trained_run.run_dir, trained_run.job_id

    shown = hpctrain(env, "status", str(run_dir), timeout=60)
    assert shown.returncode == 0, shown
    assert "COMPLETED" in shown.stdout and "completed" in shown.stdout, shown

    by_dir = hpctrain(env, "status", str(run_dir), "--json", timeout=60)
    assert by_dir.returncode == 0, by_dir
    status = by_dir.json()
    assert (status["slurm_state"], status["status"], status["job_id"]) == ("COMPLETED", "completed", job_id)
    assert status["epochs_completed"] == 2, status

    by_id = hpctrain(env, "status", job_id, "--json", timeout=60)  # the job id alone finds the run
    assert by_id.returncode == 0, by_id
    assert Path(by_id.json()["run_dir"]) == run_dir, by_id

    logs = hpctrain(env, "logs", str(run_dir), timeout=60)
    assert logs.returncode == 0, logs
    rank0_out = (submitit_dir(run_dir) / f"{job_id}_0_log.out").read_text().strip().splitlines()
    assert rank0_out and rank0_out[-1] in logs.stdout, logs  # rank 0's stdout, up to its last line

    errors = hpctrain(env, "logs", job_id, "--rank", "3", "--err", "--lines", "0", timeout=60)
    assert errors.returncode == 0, errors
    assert errors.stdout == (submitit_dir(run_dir) / f"{job_id}_3_log.err").read_text(), errors
