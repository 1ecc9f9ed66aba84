"""``hpctrain bench-data --slurm``: the measurement runs as a one-task job on a compute node
and its result comes back to the login side, as plain lines and as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .hpctrain_cli import cli_env, data_sets, hpctrain, make_dataset

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

SPEC = "jobs/smoke_2x2_cpu.yaml"


@pytest.fixture(scope="module")
def bench_setup(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[str]]:
    tmp = tmp_path_factory.mktemp("bench_data_e2e")
    env = cli_env(slurm_cluster, tmp / "state")
    data = make_dataset(env, tmp / "data", classes=3, per_class=10)
    args = [*data_sets(data, tmp / "runs"), "--seconds", "2", "--timeout", "240"]
    return env, args


def test_bench_data_runs_on_a_compute_node_and_reports_json(slurm_cluster: SlurmCluster, bench_setup) -> None:
    env, args = bench_setup
    done = hpctrain(env, "bench-data", SPEC, *args, "--slurm", "--gpu", "v100", "--json", timeout=300)
    assert done.returncode == 0, done
    report = done.json()
    assert report["cores_per_gpu"] == 1 and report["cores_source"] == "SLURM_CPUS_PER_TASK"  # read inside the job
    assert report["read"]["files"] == 30 and report["decoder"] == "cpu" and report["decode_img_s_per_core"] > 0
    assert report["demand"]["img_s_per_gpu"] > 0 and report["keeps_up"] is False  # one core cannot feed a V100
    assert report["verdict"] == f"data keeps up: no; cores needed per GPU: {report['cores_needed_per_gpu']}"
    job_id = done.stderr.split("Slurm job ")[1].split()[0]
    assert slurm_cluster.wait_state(job_id) == "COMPLETED"


def test_bench_data_on_slurm_reports_a_compute_node_error_without_traceback(bench_setup) -> None:
    env, args = bench_setup
    done = hpctrain(env, "bench-data", SPEC, *args, "--slurm", "--measure-gpu", timeout=300)
    assert done.returncode == 2, done
    assert "on the compute node: --measure-gpu: this machine has no CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_bench_data_plain_output_from_slurm(bench_setup) -> None:
    env, args = bench_setup
    done = hpctrain(env, "bench-data", SPEC, *args, "--slurm", "--demand", "50", timeout=300)
    assert done.returncode == 0, done
    assert done.stdout.splitlines()[-1].startswith("data keeps up: ")
    assert "cores per GPU: 1 (SLURM_CPUS_PER_TASK)" in done.stdout
    assert Path(done.stderr.split("logs in ")[1].split(")")[0]).is_dir()
