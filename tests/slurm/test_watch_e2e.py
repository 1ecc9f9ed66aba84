"""``hpctrain status RUN --watch`` follows a real smoke job to its end and says how it ended.

The job is the two-node smoke job (4 gloo ranks, 2 epochs of 4 steps on 32 px
images), submitted without ``--wait``; the watch is a plain (not a terminal)
``--interval 2`` and must exit by itself once Slurm reports the job completed.
Ranks' heartbeat lines are checked only when the run wrote heartbeat files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import heartbeats_dir

from .hpctrain_cli import cli_env, data_sets, hpctrain, make_dataset, submit_json, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"
STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def test_watch_follows_a_smoke_job_until_it_completes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    data = make_dataset(env, tmp_path / "data")
    submitted, report = submit_json(env, SMOKE_SPEC, *data_sets(data, tmp_path / "runs"))
    assert submitted.returncode == 0, submitted
    job_id, run_dir = report["job_id"], Path(report["run_dir"])

    watched = hpctrain(env, "status", job_id, "--watch", "--interval", "2", timeout=300)
    assert watched.returncode == 0, f"{watched}\n{task_logs(run_dir)}"
    lines = watched.stdout.splitlines()
    assert lines and all(STAMP.match(line) for line in lines), watched
    assert lines[-1].endswith(f"job {job_id} ended COMPLETED; run status: completed"), watched
    progress = [line for line in lines if "global step" in line]
    assert " PENDING, " in progress[0] or " RUNNING, " in progress[0], watched
    # 64 images / (8 per rank x 4 ranks) = 2 steps per epoch, 2 epochs
    assert progress[-1].split(" | ")[1:3] == ["epoch 2/2 step 2/2", "global step 4/4 (100%)"], watched
    assert "checkpoint step 4" in progress[-1], watched
    assert len(lines) < 60, "plain output repeats itself instead of printing changes"
    assert slurm_cluster.wait_state(job_id) == "COMPLETED"

    beats = sorted(heartbeats_dir(run_dir).glob("rank-*.json"))
    if beats:  # the heartbeat writer is in this build: its ranks appear in the output
        for rank in range(4):
            assert any(re.search(rf" rank {rank} n[12] step \d+ ", line) for line in lines), watched

    snapshot = hpctrain(env, "status", str(run_dir))
    assert snapshot.returncode == 0 and "completed" in snapshot.stdout, snapshot
