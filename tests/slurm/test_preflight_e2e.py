"""``hpctrain submit`` refuses, before queueing, what would fail after the queue
wait; and what sbatch refuses is explained. Against the real test cluster."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .hpctrain_cli import cli_env, hpctrain

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# alone (it reads the queue or stops the controller), nothing release-specific: CI runs it on 26.05's
# cluster beside 24.11's alone half (docs/testing.md, `slurm_side`)
pytestmark = pytest.mark.slurm_side

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"


def _queued(cluster: SlurmCluster) -> str:
    return cluster.run("squeue", "-h", "-o", "%i").stdout


def test_missing_data_root_and_unknown_partition_queue_nothing(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    out = tmp_path / "runs"
    before = _queued(slurm_cluster)
    refused = hpctrain(
        env,
        "submit", SMOKE_SPEC, "--set", f"output_dir={out}",
        "--set", f"data.root={tmp_path / 'no-such-data'}", "--set", "resources.partition=nope",
    )  # fmt: skip
    assert refused.returncode == 2, refused
    assert "data.root" in refused.stderr and "does not exist" in refused.stderr
    assert "no partition 'nope'" in refused.stderr and "debug" in refused.stderr
    assert "--no-preflight" in refused.stderr and "Traceback" not in refused.stderr
    assert refused.wall_s < 10
    assert not out.exists() and _queued(slurm_cluster) == before

    # Skipping the checks hands the partition to sbatch, whose refusal is classified.
    skipped = hpctrain(
        env, "submit", SMOKE_SPEC, "--no-preflight", "--set", f"output_dir={out}", "--set", "resources.partition=nope"
    )
    assert skipped.returncode == 3, skipped
    assert "partition does not exist" in skipped.stderr and "sinfo -s" in skipped.stderr
    assert "Traceback" not in skipped.stderr
    assert not any(out.rglob("run.json")) and _queued(slurm_cluster) == before
