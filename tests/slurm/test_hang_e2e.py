"""A hung rank on the two-node cluster: the watchdog ends the job long before the collective timeout.

Four ranks (2 nodes x 2 tasks) run ``tests.slurm.entrypoints:hang_on_rank``: a
few steps of compute + all-reduce, then rank 2 sleeps before the next
all-reduce while the other three wait in it. With ``hang_timeout_s`` 20 and
the gloo timeout at 300 s, only the watchdog can end the job this soon; the
test checks what a user would look at afterwards: summary.json, the stack
dumps, Slurm's accounting, and that nothing of the job is left running.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import stack_dump_path, stacks_dir
from hpctrain.contract.summary import read_summary
from hpctrain.runtime.hang import HANG_EXIT_CODE

from .entrypoints import ENTRYPOINT_MODULE
from .hpctrain_cli import cli_env, hpctrain, task_logs
from .test_runtime_e2e import ALLREDUCE_SPEC, WORLD_SIZE, wait_no_processes

if TYPE_CHECKING:
    from .conftest import SlurmCluster

HANG_TIMEOUT_S = 20
COLLECTIVE_TIMEOUT_S = 300
STUCK_RANK = 2
END_BUDGET_S = HANG_TIMEOUT_S + 60  # from the job's start: the watchdog, not gloo's 300 s, ends it


@pytest.mark.slurm_contract
def test_a_hung_rank_is_named_and_the_job_fails_fast(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    name = f"hang-{uuid.uuid4().hex[:6]}"
    submitted = hpctrain(
        env,
        "submit",
        ALLREDUCE_SPEC,
        "--wait",
        "--json",
        "--set",
        f"name={name}",
        "--set",
        f"entrypoint={ENTRYPOINT_MODULE}:hang_on_rank",
        "--set",
        f"entrypoint_args.rank={STUCK_RANK}",
        "--set",
        f"distributed.timeout_s={COLLECTIVE_TIMEOUT_S}",
        "--set",
        f"distributed.hang_timeout_s={HANG_TIMEOUT_S}",
        "--set",
        "distributed.heartbeat_interval_s=2",
        "--set",
        f"output_dir={tmp_path / 'runs'}",
        timeout=END_BUDGET_S + 120,
    )
    report = submitted.json()
    run_dir, job_id = Path(report["run_dir"]), report["job_id"]
    logs = task_logs(run_dir)

    assert submitted.returncode == 1, f"{submitted}\n{logs}"
    assert slurm_cluster.wait_state(job_id) == "FAILED", logs  # failed, not requeued
    accounted = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "ElapsedRaw,ExitCode", "-j", job_id)
    elapsed_s, exit_code = accounted.stdout.strip().splitlines()[0].split("|")
    assert int(elapsed_s) < END_BUDGET_S, f"{accounted.stdout}\n{logs}"
    assert exit_code == f"{HANG_EXIT_CODE}:0", f"{accounted.stdout}\n{logs}"
    requeues = slurm_cluster.run("sacct", "-D", "-X", "-n", "-P", "-o", "State", "-j", job_id)
    assert "REQUEUED" not in requeues.stdout, requeues.stdout

    beats = {beat.rank: beat for beat in read_heartbeats(run_dir)}
    assert sorted(beats) == list(range(WORLD_SIZE)), logs
    assert beats[STUCK_RANK].node == slurm_cluster.nodes[1]  # Slurm's block distribution: ranks 2-3 on the second node
    summary = read_summary(run_dir)
    assert summary is not None, logs
    assert summary.status == "failed"
    assert summary.hung_rank == STUCK_RANK, f"{summary}\n{logs}"
    assert summary.hung_node == beats[STUCK_RANK].node
    assert summary.hung_phase == "forward_backward"  # stuck in its compute, before the all-reduce
    stuck_on = f"hang: rank {STUCK_RANK} on node {slurm_cluster.nodes[1]}"
    assert summary.failed_reason.startswith(f"{stuck_on} made no progress")  # type: ignore[union-attr]
    assert summary.stack_dumps == str(stacks_dir(run_dir))
    for rank in range(WORLD_SIZE):
        assert stack_dump_path(run_dir, rank).is_file(), f"rank {rank} dumped no stacks\n{logs}"
    assert "_stuck_before_collective" in stack_dump_path(run_dir, STUCK_RANK).read_text()
    for rank in (0, 1, 3):  # the others waited in the collective
        assert beats[rank].phase == "allreduce", beats[rank]
        assert " in all_reduce" in stack_dump_path(run_dir, rank).read_text()

    status = hpctrain(env, "status", str(run_dir))
    assert stuck_on in status.stdout, status
    assert wait_no_processes(slurm_cluster, job_id) == [], "processes of the hung job outlived it"
