"""Chains (``after:``, docs/chains.md) on the two-node cluster: three runs that follow their first run.

One chain per test, each run as small as it can be: the first is the trainer's
smoke run on 2 nodes x 1 task (it writes real checkpoints), the second and third are one-task
scripts (``scripts/ddp_env.py``) that report the arguments they got, so
``{after.checkpoint}`` and ``{after.run_dir}`` are read back as the script saw
them. The first run is requeued by the time-limit signal (same job id: the
chain keeps waiting), then cancelled and resumed (a new job id: the chain is
submitted again after it), and the two dependents run exactly once, after the
first's final completion, from its final checkpoint. A failed first run ends
the other two without running them, the reason in their status. Not in
``slurm_contract``: the chain asks Slurm only for ``afterany`` and
``scontrol update``, which every supported version has.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import step_dir_name

from .hpctrain_cli import hpctrain, task_logs
from .script_helpers import ScriptWorkspace, make_script_workspace
from .stop_helpers import (
    EPOCHS,
    STEPS_PER_EPOCH,
    Run,
    Workspace,
    job_record,
    latest_step,
    make_workspace,
    submit,
    wait_for,
    wait_requeued,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

START_TIMEOUT_S = 120  # submit -> first checkpoint: the ranks importing torch on 2 cores
RUN_TIMEOUT_S = 240
ONE_TASK = {"nodes": 1, "tasks_per_node": 1}


@pytest.fixture(scope="module")
def train_ws(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(slurm_cluster, tmp_path_factory.mktemp("chain-train"), as_user=True)


@pytest.fixture(scope="module")
def ws(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> ScriptWorkspace:
    return make_script_workspace(slurm_cluster, tmp_path_factory.mktemp("chain-steps"))


def dependent(ws: ScriptWorkspace, name: str, upstream: Run, tag: str, *args: str) -> Run:
    """A one-task script run chained after ``upstream`` with ``submit --after``; it reports ``--tag TAG``."""
    script = {"path": "ddp_env.py", "args": ["--steps", "1", "--step-s", "0.1", "--tag", tag, *args]}
    spec = ws.spec(name, script, resources=ONE_TASK)
    return ws.submit(spec, "--after", str(upstream.run_dir))


def current_job(run: Run) -> str:
    return json.loads((run.run_dir / "run.json").read_text())["job_id"]


def reports(run: Run) -> list[dict]:
    """Every start's report of the script (one file per start and rank)."""
    return [json.loads(path.read_text()) for path in sorted(run.run_dir.glob("env-*.json"))]


def ended(cluster: SlurmCluster, run: Run, timeout: float) -> str:
    """The run's current job, once Slurm says it ended (after a resume, the job id run.json names now)."""
    return cluster.wait_state(current_job(run), timeout=timeout)


def test_a_chain_waits_through_a_requeue_and_a_resume_and_runs_once_from_the_final_checkpoint(
    slurm_cluster: SlurmCluster, train_ws: Workspace, ws: ScriptWorkspace
) -> None:
    first = submit(train_ws, "name=chain_first")
    second = dependent(ws, "chain_second", first, "{after.checkpoint}")
    third = dependent(ws, "chain_third", second, "{after.run_dir}")
    for run, upstream in ((second, first), (third, second)):
        record = job_record(slurm_cluster, run.job_id)
        assert record.get("JobState") == "PENDING", record
        assert record.get("Dependency", "").startswith(f"afterany:{upstream.job_id}"), record

    wait_for(lambda: latest_step(first.run_dir) >= 2 or None, "the first checkpoint", START_TIMEOUT_S, first)
    slurm_cluster.run("scancel", "--signal=USR2", first.job_id)  # the time-limit warning: requeued, same job id
    wait_requeued(slurm_cluster, first.job_id, restarts=1)
    assert job_record(slurm_cluster, second.job_id).get("JobState") == "PENDING", "a requeue is no end"
    slurm_cluster.release(first.job_id)
    wait_for(lambda: latest_step(first.run_dir) >= 4 or None, "a checkpoint of start 2", START_TIMEOUT_S, first)

    status = hpctrain(train_ws.env, "status", str(first.run_dir))
    assert status.returncode == 0 and str(third.run_dir) in status.stdout and "pending" in status.stdout, status
    cancelled = hpctrain(train_ws.env, "cancel", str(first.run_dir), timeout=150)  # the whole chain, one command
    assert cancelled.returncode == 0 and f"cancelled with its chain: {second.run_dir}" in cancelled.stdout, cancelled
    assert reports(second) == [] and reports(third) == [], "cancelled before they started"

    resumed = hpctrain(train_ws.env, "resume", str(first.run_dir), "--json")
    assert resumed.returncode == 0, resumed
    assert str(second.run_dir) in resumed.stderr + resumed.stdout, resumed  # says which dependents follow it
    assert ended(slurm_cluster, first, RUN_TIMEOUT_S) == "COMPLETED", task_logs(first.run_dir)
    assert ended(slurm_cluster, second, RUN_TIMEOUT_S) == "COMPLETED", task_logs(second.run_dir)
    assert ended(slurm_cluster, third, RUN_TIMEOUT_S) == "COMPLETED", task_logs(third.run_dir)

    total = EPOCHS * STEPS_PER_EPOCH
    summary = first.summary()
    assert (summary["status"], summary["global_step"]) == ("completed", total), summary
    final = first.run_dir / "checkpoints" / step_dir_name(total)
    (got_second,), (got_third,) = reports(second), reports(third)  # each ran exactly once
    assert got_second["argv"][-1] == str(final), got_second
    assert got_third["argv"][-1] == str(second.run_dir), got_third
    completed_at = (first.run_dir / "summary.json").stat().st_mtime
    started_at = min(path.stat().st_mtime for path in second.run_dir.glob("env-*.json"))
    assert started_at >= completed_at, "the second ran after the first's final completion"
    chain = hpctrain(train_ws.env, "status", str(third.run_dir), "--json").json()["chain"]
    assert [(row["run_dir"], row["status"]) for row in chain] == [
        (str(first.run_dir), "completed"),
        (str(second.run_dir), "completed"),
        (str(third.run_dir), "completed"),
    ], chain


def test_a_failed_first_run_ends_the_chain_with_its_reason(slurm_cluster: SlurmCluster, ws: ScriptWorkspace) -> None:
    script = {"path": "ddp_env.py", "args": ["--steps", "3", "--step-s", "0.1", "--fail-rank", "0", "--fail-step", "1"]}
    first = ws.submit(ws.spec("chain_fails", script, resources=ONE_TASK))
    second = dependent(ws, "chain_fails_second", first, "{after.run_dir}")
    third = dependent(ws, "chain_fails_third", second, "{after.run_dir}")
    assert ended(slurm_cluster, first, RUN_TIMEOUT_S) == "FAILED", task_logs(first.run_dir)
    ended(slurm_cluster, third, RUN_TIMEOUT_S)
    assert reports(second) == [] and reports(third) == [], "neither ran its script"
    shown = hpctrain(ws.env, "status", str(second.run_dir), "--json").json()
    assert shown["status"] == "stopped" and f"after: {first.run_dir} failed" in shown["stop_reason"], shown
    third_shown = hpctrain(ws.env, "status", str(third.run_dir), "--json").json()
    assert f"after: {second.run_dir} cancelled" in third_shown["stop_reason"], third_shown
    assert [row["status"] for row in third_shown["chain"]] == ["failed", "ended by its chain", "ended by its chain"]
