"""``hpctrain plan`` on a busy cluster (issue 40): one node held for a known time (of the test cluster's
two), so a 1-node job starts now and a 2-node job when the holder's time limit ends. The plan's starts are
Slurm's; a 2-node job then submitted starts when the plan said; a partition limit shorter than the run gives
the right chunks."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import TYPE_CHECKING

import pytest

from .hpctrain_cli import cli_env, hpctrain

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# alone (it reads the queue or stops the controller), nothing release-specific: CI runs it on 26.05's
# cluster beside 24.11's alone half (docs/testing.md, `slurm_side`)
pytestmark = pytest.mark.slurm_side

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"  # 2 nodes x 2 CPU tasks, signals.signal_delay_s 60


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("plan")
    (tmp / "data").mkdir()
    return {"env": cli_env(slurm_cluster, tmp / "state"), "sets": ["--set", f"data.root={tmp / 'data'}",
            "--set", f"output_dir={tmp / 'runs'}"]}  # fmt: skip


def plan(ws: dict, *args: str) -> dict:
    done = hpctrain(ws["env"], "plan", SMOKE_SPEC, "--json", *ws["sets"], *args, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done
    return json.loads(done.stdout)


def wait_for(cluster: SlurmCluster, job: str, state: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while cluster.run("squeue", "-h", "-t", "all", "-o", "%T", "-j", job).stdout.strip() != state:
        assert time.monotonic() < deadline, f"job {job} never became {state}"
        time.sleep(0.5)


def when(text: str) -> float:
    return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").timestamp()


def test_plan_starts_are_slurms_and_a_job_starts_when_planned(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    run = slurm_cluster.run
    # The holder ends by itself just before its limit: Slurm's estimate assumes a job runs to its limit, and
    # slurmctld ends an overrunning job only at its next periodic check (up to ~30 s late), which is neither.
    held = run("sbatch", "--parsable", "--exclusive", "-N1", "-t", "1", "-o", "/dev/null", "--wrap", "sleep 57")
    held_id = held.stdout.strip().split(";")[0]
    queued = None
    try:
        wait_for(slurm_cluster, held_id, "RUNNING", 60)
        held_end = when(run("squeue", "-h", "-o", "%e", "-j", held_id).stdout.strip())
        made = plan(workspace, "--nodes", "1,2", "--steps", "40", "--step-time", "0.5", "--restart", "10")
        one, two = made["shapes"]
        assert one["start_in_s"] < 15 and one["chunks"] == 1, one
        assert abs(when(two["expected_start"]) - held_end) <= 3, (two, held_end)  # the holder's limit
        assert made["recommended_nodes"] == 1 and "1 node finishes first" in made["reason"], made
        # the 2-node job, queued now, starts when the plan said (Slurm ends the holder at its limit)
        queued = run("sbatch", "--parsable", "--exclusive", "-N2", "-t", "1", "-o", "/dev/null", "--wrap", "true")
        queued_id = queued.stdout.strip().split(";")[0]
        wait_for(slurm_cluster, queued_id, "COMPLETED", 150)
        started = when(run("sacct", "-X", "-n", "-P", "-o", "Start", "-j", queued_id).stdout.strip())
        planned_wait = when(two["expected_start"]) - time.mktime(
            time.strptime(made["made_at"][:19], "%Y-%m-%dT%H:%M:%S")
        )
        assert abs(started - when(two["expected_start"])) <= max(5.0, 0.2 * planned_wait), (started, two)
    finally:
        run("scancel", held_id, check=False)
        if queued is not None:
            run("scancel", queued.stdout.strip().split(";")[0], check=False)


def test_a_partition_limit_below_the_run_gives_its_chunks(workspace: dict) -> None:
    made = plan(workspace, "--set", "resources.partition=short", "--nodes", "1", "--steps", "200", "--step-time", "1",
                "--restart", "10")  # fmt: skip
    (one,) = made["shapes"]
    assert made["chunk_limit_s"] == 120 and "MaxTime" in made["chunk_limit_source"], made
    assert one["chunks"] == 4, one  # 200 s of training, 120 - 10 - 60 s a chunk
    assert any("above short's MaxTime" in note for note in made["notes"]), made["notes"]
