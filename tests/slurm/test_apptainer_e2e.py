"""The smoke job in a real Apptainer (1.4.5, Debian sid) on the two-node cluster.

`slurm-cluster up --apptainer` puts Apptainer on every node; `slurm-cluster
image` builds a small SIF (Debian sid's libraries, no Slurm clients). The job
binds the venv and this checkout in, the way users bind a shared software
stack, and runs as root with `container.options: [--no-privs]` (this machine
withholds a capability that Apptainer asks for as root). Every task runs in
the image, where there is no `scontrol`, so the requeues after the time-limit
signal and after partition preemption must go through the batch step's relay; the run must end with the
weights of an uninterrupted run in the same image, and a cancel must leave no
process (Apptainer's starter and squashfuse included) on any node.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import slurm_relay_dir, submitit_dir

from .conftest import REPO_ROOT
from .hpctrain_cli import hpctrain, task_logs
from .stop_helpers import (
    EPOCHS,
    LAST_RANK,
    STEPS_PER_EPOCH,
    UNTIL_CANCELLED,
    Run,
    Workspace,
    assert_completed_exactly,
    cancel_leaves_nothing,
    cmdline_of,
    environ_of,
    make_workspace,
    report_timing,
    requeue_then_preempt,
    wait_for,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Alone (its own cluster shape), with nothing release-specific (the container is the subject; its nodes come from
# the fixture): CI runs it in 26.05's alone half on the side cluster, off 24.11's critical path (docs/testing.md).
pytestmark = pytest.mark.slurm_side

SPEC = "jobs/smoke_apptainer_cpu.yaml"
TOTAL_STEPS = EPOCHS * STEPS_PER_EPOCH
START_TIMEOUT_S = 120  # submit -> first checkpoint: the ranks starting Apptainer and importing torch on 2 cores
RUN_TIMEOUT_S = 180


CLUSTER_SHAPE = "apptainer"  # conftest.py: this file runs with the others that need it, after the default's


@pytest.fixture(scope="module")
def image(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.monotonic()
    slurm_cluster.use_apptainer()
    built = slurm_cluster.build_image(tmp_path_factory.mktemp("image") / "hpctrain.sif")
    report_timing("up --apptainer + slurm-cluster image", time.monotonic() - started)
    return built


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, image: Path, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(slurm_cluster, tmp_path_factory.mktemp("apptainer"))


def bound_in() -> list[str]:
    """This checkout (hpctrain, tests), the venv and its interpreter's home, each at its own path."""
    wanted = [REPO_ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
    mounts: list[str] = []
    for path in sorted({str(p) for p in wanted}):
        if not any(path == m or path.startswith(m + "/") for m in mounts):
            mounts.append(path)
    return mounts


def submit_in_image(ws: Workspace, image: Path, name: str, *more: str) -> Run:
    sets = [
        *more,
        f"name={name}",
        f"container.image={image}",
        f"container.python={sys.executable}",
        f"container.mounts=[{', '.join(bound_in())}]",
        "container.options=[--no-privs]",
    ]
    done = hpctrain(ws.env, "submit", SPEC, "--json", *ws.sets(*sets))
    assert done.returncode == 0, done
    report = done.json()
    return Run(report["job_id"], Path(report["run_dir"]))


def assert_ranks_in_image(cluster: SlurmCluster, run: Run, image: Path) -> None:
    """Rank 0 and the last rank (one on each node) train inside the image, where there is no scontrol."""

    def in_image(rank: int) -> list[int]:
        return [
            pid
            for pid in cluster.processes_with_env("SLURM_JOB_ID", run.job_id)
            if environ_of(pid).get("SLURM_PROCID") == str(rank)
            and environ_of(pid).get("APPTAINER_CONTAINER") == str(image)
            and "submitit.core._submit" in cmdline_of(pid)
        ]

    for rank in (0, LAST_RANK):
        pids = wait_for(lambda r=rank: in_image(r), f"rank {rank} in the image", START_TIMEOUT_S, run)
        assert not Path(f"/proc/{pids[0]}/root/usr/bin/scontrol").exists(), "the image must have no scontrol"


@pytest.fixture(scope="module")
def reference_weights(slurm_cluster: SlurmCluster, workspace: Workspace, image: Path) -> str:
    started = time.monotonic()
    run = submit_in_image(workspace, image, "apptainer_uninterrupted")
    state = slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S)
    assert state == "COMPLETED", task_logs(run.run_dir)
    summary = run.summary()
    assert (summary["status"], summary["global_step"], summary["restarts"]) == ("completed", TOTAL_STEPS, 0), summary
    report_timing("uninterrupted run in Apptainer, submit to end", time.monotonic() - started)
    return summary["weights_sha256"]


def assert_relayed(run: Run) -> None:
    """Every relayed request was answered and collected, and rank 0 asked for the job's state through it."""
    relay = slurm_relay_dir(run.run_dir) / run.job_id
    assert relay.is_dir() and not list(relay.iterdir()), "every relayed request was answered and collected"
    assert "job is running: requeue" in task_logs(run.run_dir, lines=400)  # scontrol show job, relayed


def test_usr2_then_preemption_requeue_through_the_relay_and_resume_bit_identically(
    slurm_cluster: SlurmCluster, workspace: Workspace, image: Path, reference_weights: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    run = submit_in_image(workspace, image, "apptainer_preempted")
    assert_ranks_in_image(slurm_cluster, run, image)
    requeue_then_preempt(slurm_cluster, run, tmp_path, START_TIMEOUT_S)
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    report_timing("Apptainer run requeued and preempted, submit to end", time.monotonic() - started)
    assert_completed_exactly(run, 2, reference_weights)
    out = (submitit_dir(run.run_dir) / f"{run.job_id}_0_log.out").read_text()
    assert "stopping (timeout)" in out and "stopping (preempted)" in out, out
    assert_relayed(run)


def test_cancel_leaves_no_process_on_any_node(slurm_cluster: SlurmCluster, workspace: Workspace, image: Path) -> None:
    run = submit_in_image(workspace, image, "apptainer_cancelled", UNTIL_CANCELLED)
    cancel_leaves_nothing(slurm_cluster, workspace, run, "Apptainer", START_TIMEOUT_S)
