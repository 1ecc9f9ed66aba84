"""The runtime end to end: ``hpctrain submit`` -> Slurm -> one launcher per task -> user code.

Each test runs the real command line against the two-node test cluster and
checks what a user would check: exit codes, Slurm's accounting, per-rank
results, and the logs.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from submitit.core.utils import pickle_load

from hpctrain.contract.rundir import submitit_dir

from .entrypoints import ENTRYPOINT_MODULE
from .hpctrain_cli import CliResult, cli_env, hpctrain, task_logs

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

ALLREDUCE_SPEC = "jobs/entrypoint_allreduce.yaml"
SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"
WORLD_SIZE = 4  # both specs: 2 nodes x 2 tasks
# A failed rank must end the whole job this fast, not after a collective timeout.
FAILURE_BUDGET_S = 120


def task_results(run_dir: Path, job_id: str, world_size: int) -> list[dict[str, Any]]:
    """What each task's TaskLauncher returned, read from submitit's result pickles, in rank order."""
    results = []
    for task in range(world_size):
        path = submitit_dir(run_dir) / f"{job_id}_{task}_result.pkl"
        assert path.is_file(), f"task {task} left no result at {path}\n{task_logs(run_dir)}"
        outcome, value = pickle_load(path)
        assert outcome == "success", f"task {task}: {outcome}\n{value}"
        results.append(value)
    return results


def wait_no_processes(cluster: SlurmCluster, job_id: str, timeout: float = 30) -> list[int]:
    """PIDs of the job still alive once `timeout` has passed (empty as soon as none are left)."""
    deadline = time.monotonic() + timeout
    pids = cluster.processes_with_env("SLURM_JOB_ID", job_id)
    while pids and time.monotonic() < deadline:
        time.sleep(0.5)
        pids = cluster.processes_with_env("SLURM_JOB_ID", job_id)
    return pids


def parse_rank_table(text: str) -> list[dict[str, str]]:
    """The dry run's rank table as one {column: cell} dict per rank.

    Columns are found by the header row (a row naming rank, node and device),
    cells by runs of 2+ spaces; box-drawing characters or pipes, if the table
    has them, count as separators too.
    """
    header: list[str] | None = None
    rows = []
    for line in text.splitlines():
        cells = [c for c in re.split(r"\s{2,}", re.sub(r"[\u2500-\u257f|]", "  ", line).strip()) if c]
        if header is None:
            if {"rank", "node", "device"} <= set(cells):
                header = cells
        elif len(cells) == len(header) and cells[0].isdigit():
            rows.append(dict(zip(header, cells)))
    return rows


@pytest.mark.slurm_contract
def test_allreduce_entrypoint_runs_on_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    submitted = hpctrain(
        env, "submit", ALLREDUCE_SPEC, "--wait", "--json", "--set", f"output_dir={tmp_path / 'runs'}", timeout=180
    )
    report = submitted.json()
    run_dir = Path(report["run_dir"])
    assert submitted.returncode == 0, f"{submitted}\n{task_logs(run_dir)}"
    assert run_dir.parent == tmp_path / "runs" / "entrypoint_allreduce"
    assert report["cluster"] == "slurm" and report["backend"] == "slurm"  # the profile, then how it ran
    assert slurm_cluster.wait_state(report["job_id"]) == "COMPLETED"

    results = task_results(run_dir, report["job_id"], WORLD_SIZE)
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    # Slurm's block distribution: ranks 0-1 on the first node, 2-3 on the second.
    first, second = slurm_cluster.nodes
    assert [r["hostname"] for r in results] == [first, first, second, second]
    for r in results:
        out = r["result"]
        assert out["hostname"] == r["hostname"], r  # the user code ran where the launcher did
        assert (out["world_size"], out["backend"], out["device"]) == (WORLD_SIZE, "gloo", "cpu"), r
        assert out["sum"] == out["expected"] == 10, r  # 1 + 2 + 3 + 4


def test_failing_rank_fails_the_job_fast(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    submitted = hpctrain(
        env,
        "submit",
        ALLREDUCE_SPEC,
        "--wait",
        "--json",
        "--set",
        "name=fail_on_rank",
        "--set",
        f"entrypoint={ENTRYPOINT_MODULE}:fail_on_rank",
        "--set",
        "entrypoint_args.rank=3",
        "--set",
        f"output_dir={tmp_path / 'runs'}",
        timeout=FAILURE_BUDGET_S + 60,
    )
    report = submitted.json()
    run_dir, job_id = Path(report["run_dir"]), report["job_id"]
    logs = task_logs(run_dir)

    assert submitted.returncode == 1, f"{submitted}\n{logs}"
    # The other ranks sleep for 10 minutes: only srun --kill-on-bad-exit ends them this soon.
    assert submitted.wall_s < FAILURE_BUDGET_S, f"{submitted}\n{logs}"
    assert f"job {job_id} ended FAILED" in submitted.stderr, submitted
    assert slurm_cluster.wait_state(job_id) == "FAILED"

    rank3_err = (submitit_dir(run_dir) / f"{job_id}_3_log.err").read_text(errors="replace")
    expected = f"hpctrain: rank 3 on node {slurm_cluster.nodes[1]} failed: RuntimeError: deliberate failure on rank 3"
    assert expected in rank3_err, logs
    for rank in (0, 1, 2):  # the survivors were killed, not blamed
        err = (submitit_dir(run_dir) / f"{job_id}_{rank}_log.err").read_text(errors="replace")
        assert "hpctrain: rank" not in err, logs
    assert wait_no_processes(slurm_cluster, job_id) == [], "processes of the failed job outlived it"


def test_dry_run_prints_four_ranks_on_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    name = f"dryrun_{uuid.uuid4().hex[:8]}"
    output_dir = tmp_path / "runs"
    dry: CliResult = hpctrain(
        cli_env(slurm_cluster, tmp_path / "state"),
        "submit",
        SMOKE_SPEC,
        "--dry-run",
        "--set",
        f"name={name}",
        "--set",
        f"output_dir={output_dir}",
        timeout=60,
    )
    assert dry.returncode == 0, dry
    assert dry.wall_s < 20, dry  # renders locally; talks to no daemon

    script = dry.stdout
    assert "#SBATCH --nodes=2\n" in script, dry
    assert "#SBATCH --ntasks-per-node=2\n" in script, dry
    assert "--kill-on-bad-exit=1" in script, dry
    rows = parse_rank_table(dry.stdout)
    local = next((key for key in (rows[0] if rows else {}) if key.startswith("local")), "local")
    assert [(row["rank"], row.get(local), row["node"], row["device"]) for row in rows] == [
        ("0", "0", "node0", "cpu"),
        ("1", "1", "node0", "cpu"),
        ("2", "0", "node1", "cpu"),
        ("3", "1", "node1", "cpu"),
    ], dry
    assert {row["master"] for row in rows} == {"node0:<port from job id>"}, dry

    # Nothing was submitted and nothing was written.
    assert not output_dir.exists()
    accounted = slurm_cluster.run("sacct", "-X", "-n", "-P", "-o", "JobID", "--name", name, "-S", "now-1hour")
    queued = slurm_cluster.run("squeue", "-h", "-n", name)
    assert accounted.stdout.strip() == "" and queued.stdout.strip() == ""
