"""The test cluster itself: nodes, partitions, submitit jobs and accounting."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import submitit

from hpctrain.contract.slurm import Slurm

from . import jobfuncs
from .conftest import HOST_ADDR

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared


def _executor(folder: Path, **params: object) -> submitit.SlurmExecutor:
    executor = submitit.SlurmExecutor(folder=folder)
    executor.update_parameters(partition="debug", time=5, cpus_per_task=1, setup=jobfuncs.importable_setup(), **params)
    return executor


def _results(job: submitit.Job, cluster: SlurmCluster, timeout: float = 60) -> list:
    """job.results(), but failing after `timeout` instead of hanging forever."""
    deadline = time.monotonic() + timeout
    while not job.done():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"job {job.job_id} not done after {timeout}s "
                f"(state {job.state})\n{job.stderr()}\n{cluster.log_tail(30)}"
            )
        time.sleep(0.2)
    return job.results()


@pytest.mark.slurm_contract
def test_srun_spans_two_named_nodes(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run("srun", "-N2", "hostname").stdout.split()
    assert sorted(out) == slurm_cluster.nodes


@pytest.mark.slurm_contract
def test_partitions_preempt_by_priority_tier(slurm_cluster: SlurmCluster) -> None:
    debug = slurm_cluster.run("scontrol", "show", "partition", "debug").stdout
    urgent = slurm_cluster.run("scontrol", "show", "partition", "urgent").stdout
    assert "Default=YES" in debug and "PriorityTier=1 " in debug
    assert "PreemptMode=REQUEUE" in debug
    assert "PriorityTier=10 " in urgent and "PreemptMode=OFF" in urgent
    # what the healing decider counts before a requeue that keeps nodes out (HealRecord.room): this release's
    # sinfo, read by the one client (its format and states), per partition
    client = Slurm(lambda command, **_: slurm_cluster.run(*command, check=False))
    nodes = slurm_cluster.nodes
    assert client.usable_nodes("debug,urgent") == {"debug": nodes, "urgent": nodes}


@pytest.mark.slurm_contract
def test_submitit_two_nodes_two_tasks_each(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    executor = _executor(tmp_path, nodes=2, ntasks_per_node=2)
    job = executor.submit(jobfuncs.whoami)
    results = _results(job, slurm_cluster)
    assert sorted(r["procid"] for r in results) == [0, 1, 2, 3]
    assert sorted({r["host"] for r in results}) == slurm_cluster.nodes
    assert sorted(r["localid"] for r in results) == [0, 0, 1, 1]


@pytest.mark.slurm_contract
def test_array_tasks_have_distinct_job_ids(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    executor = _executor(tmp_path, nodes=1, ntasks_per_node=1)
    jobs = executor.map_array(jobfuncs.whoami_indexed, [0, 1, 2])
    results = [_results(job, slurm_cluster)[0] for job in jobs]
    assert [r["index"] for r in results] == [0, 1, 2]
    assert sorted(r["array_task"] for r in results) == ["0", "1", "2"]
    assert len({r["job_id"] for r in results}) == 3


@pytest.mark.slurm_contract
def test_sacct_reports_completed_and_failed(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    ok = slurm_cluster.sbatch(f"--chdir={tmp_path}", "--wrap", "true")
    bad = slurm_cluster.sbatch(f"--chdir={tmp_path}", "--wrap", "exit 1")
    assert slurm_cluster.wait_state(ok) == "COMPLETED"
    assert slurm_cluster.wait_state(bad) == "FAILED"


@pytest.mark.slurm_contract
def test_jobs_resolve_node_names(slurm_cluster: SlurmCluster) -> None:
    # torch's TCPStore connects to the master by name: every node must resolve every node.
    first, second = slurm_cluster.nodes
    out = slurm_cluster.run("srun", "-N2", "getent", "hosts", first, second).stdout
    subnet = HOST_ADDR.rsplit(".", 1)[0]
    assert out.count(f"{subnet}.11 ") == 2 and out.count(f"{subnet}.12 ") == 2, out


@pytest.mark.slurm_contract
def test_processes_with_env_sees_job_processes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = slurm_cluster.sbatch(f"--chdir={tmp_path}", "-N2", "--wrap", "srun sleep 30")
    try:
        deadline = time.monotonic() + 20
        pids: list[int] = []
        while time.monotonic() < deadline:
            pids = slurm_cluster.processes_with_env("SLURM_JOB_ID", job_id)
            if len(pids) >= 3:  # batch script + one `sleep` per node (+ srun)
                break
            time.sleep(0.2)
        assert len(pids) >= 3, pids
    finally:
        slurm_cluster.run("scancel", job_id)
    assert slurm_cluster.wait_state(job_id) == "CANCELLED"
