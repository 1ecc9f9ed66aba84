"""strategy: ps on the two-node cluster: 1 server + 3 workers over TensorPipe RPC between the nodes.

A sync run interrupted by the time-limit signal (USR2), requeued and resumed
ends with the same weights, bit for bit, as the same run never interrupted.
(Weight equality with ddp is checked in the local tier, tests/local/test_trainer_ps.py,
where both runs read exactly the same batches.)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .hpctrain_cli import hpctrain, task_logs
from .stop_helpers import (
    Run,
    Workspace,
    latest_step,
    make_workspace,
    report_timing,
    train_steps_logged,
    wait_for,
    wait_requeued,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

PS_SPEC = "jobs/ps_sync_cpu.yaml"
EPOCHS, STEPS_PER_EPOCH = 2, 4
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
# 64 train images / (3 workers x batch 2) = 11 batches per epoch, 4 of them used.
PS_SETS = (
    "trainer.deterministic=true",
    f"trainer.epochs={EPOCHS}",
    f"trainer.max_steps_per_epoch={STEPS_PER_EPOCH}",
    "trainer.batch_size=2",
    "checkpoint.every_steps=2",
)
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 180


def submit_ps(ws: Workspace, name: str) -> Run:
    sets = [
        arg
        for item in (f"data.root={ws.data}", f"output_dir={ws.runs}", *PS_SETS, f"name={name}")
        for arg in ("--set", item)
    ]
    done = hpctrain(ws.env, "submit", PS_SPEC, "--json", *sets, timeout=60)
    assert done.returncode == 0, done
    report = done.json()
    return Run(report["job_id"], Path(report["run_dir"]))


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(slurm_cluster, tmp_path_factory.mktemp("ps"))


def test_sync_ps_requeued_by_usr2_resumes_bit_identically(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    started = time.monotonic()
    reference = submit_ps(workspace, "ps_uninterrupted")
    assert slurm_cluster.wait_state(reference.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(
        reference.run_dir
    )
    summary = reference.summary()
    assert (summary["status"], summary["global_step"], summary["strategy"]) == ("completed", TOTAL_STEPS, "ps")
    assert (summary["world_size"], summary["num_nodes"], summary["global_batch_size"]) == (4, 2, 6)
    report_timing("ps sync reference run", time.monotonic() - started)

    run = submit_ps(workspace, "ps_requeued")
    wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
    slurm_cluster.run("scancel", "--signal=USR2", run.job_id)
    wait_requeued(slurm_cluster, run.job_id, restarts=1)
    stopped_at = latest_step(run.run_dir)
    assert 2 <= stopped_at < TOTAL_STEPS, stopped_at
    slurm_cluster.release(run.job_id)
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)

    final = run.summary()
    assert (final["status"], final["global_step"], final["restarts"]) == ("completed", TOTAL_STEPS, 1), final
    assert train_steps_logged(run.run_dir) == list(range(1, TOTAL_STEPS + 1)), "no step repeated or skipped"
    assert final["weights_sha256"] == summary["weights_sha256"], task_logs(run.run_dir)
