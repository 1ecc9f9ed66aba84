"""A study end to end: the smoke job on 1 and 2 nodes, one Slurm job per point, then ``status``.

One study (two small jobs, a few steps each) is shared by the first tests, and
by test_report_e2e.py (study_helpers.shared_smoke_study); the preflight and
cancel tests submit their own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import run_info_path, study_file, summary_path
from hpctrain.contract.summary import read_summary

from .hpctrain_cli import cli_env, data_sets, hpctrain, make_dataset, submit_json, task_logs
from .study_helpers import STUDY_SPEC, SmokeStudy, shared_smoke_study

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared


@pytest.fixture(scope="module")
def smoke_study(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> SmokeStudy:
    return shared_smoke_study(tmp_path_factory, slurm_cluster)  # test_report_e2e.py reports on the same study


@pytest.mark.slurm_contract
def test_every_point_is_its_own_completed_job(slurm_cluster: SlurmCluster, smoke_study: SmokeStudy) -> None:
    smoke_study.check_submitted()
    record = json.loads(study_file(smoke_study.study_dir).read_text())
    assert record["kind"] == "study"
    assert record["axes"] == {"resources.nodes": [1, 2]}
    assert [p["label"] for p in record["points"]] == ["nodes-1", "nodes-2"]
    job_ids = [p["job_id"] for p in record["points"]]
    assert all(job_ids) and len(set(job_ids)) == 2, job_ids  # two jobs, not one array
    assert job_ids == [run["job_id"] for run in smoke_study.runs]
    for job_id in job_ids:
        assert slurm_cluster.wait_state(job_id) == "COMPLETED"

    for point in record["points"]:
        run_dir = smoke_study.study_dir / point["run_dir"]
        expected = point["nodes"] * 2  # tasks_per_node: 2
        summary = json.loads(summary_path(run_dir).read_text())
        run_info = json.loads(run_info_path(run_dir).read_text())
        assert (summary["status"], summary["world_size"], summary["num_nodes"]) == (
            "completed",
            expected,
            point["nodes"],
        )
        assert run_info["world_size"] == point["world_size"] == expected
        assert point["global_batch"] == 8 * expected


def test_status_of_the_study_lists_both_points_completed(smoke_study: SmokeStudy) -> None:
    smoke_study.check_submitted()
    shown = hpctrain(smoke_study.env, "status", str(smoke_study.study_dir), "--json")
    assert shown.returncode == 0, shown
    points = {p["label"]: p for p in shown.json()["points"]}
    assert {label: (p["status"], p["slurm_state"], p["world_size"]) for label, p in points.items()} == {
        "nodes-1": ("completed", "COMPLETED", 2),
        "nodes-2": ("completed", "COMPLETED", 4),
    }
    table = hpctrain(smoke_study.env, "status", str(smoke_study.study_dir))
    assert table.returncode == 0, table
    rows = [line for line in table.stdout.splitlines() if "nodes-" in line]
    assert len(rows) == 2 and all("completed" in row for row in rows), table.stdout


def test_a_study_dir_is_not_resumed_as_a_whole(smoke_study: SmokeStudy) -> None:
    refused = hpctrain(smoke_study.env, "resume", str(smoke_study.study_dir))
    assert refused.returncode != 0
    assert f"hpctrain resume {Path(smoke_study.study_dir) / 'nodes-1'}" in refused.stderr, refused


def test_preflight_refuses_a_point_larger_than_the_partition(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / split).mkdir(parents=True)
    refused = hpctrain(
        cli_env(slurm_cluster, tmp_path / "state"),
        "submit",
        STUDY_SPEC,
        "--set",
        "study={resources.nodes: [1, 4]}",
        "--set",
        f"data.root={data}",
        "--set",
        f"output_dir={tmp_path / 'runs'}",
    )
    assert refused.returncode == 2, refused
    assert "4 nodes, but partition 'debug' has 2" in refused.stderr and "(study point nodes-4)" in refused.stderr
    assert not (tmp_path / "runs").exists()  # nothing was queued, not even the nodes-1 point


def test_cancel_of_a_study_cancels_every_points_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    env = cli_env(slurm_cluster, tmp_path / "state")
    data = make_dataset(env, tmp_path / "data")
    long = ("trainer.epochs=100", "trainer.max_steps_per_epoch=100")  # still running when cancelled
    submitted, report = submit_json(env, STUDY_SPEC, *data_sets(data, tmp_path / "runs", *long))
    assert submitted.returncode == 0, submitted
    first, second = (run["job_id"] for run in report["runs"])
    wait_until_training(Path(report["runs"][0]["run_dir"]), timeout_s=120)

    cancelled = hpctrain(env, "cancel", report["study_dir"], timeout=300)
    assert cancelled.returncode == 0, cancelled
    assert slurm_cluster.wait_state(first) == "CANCELLED"
    assert slurm_cluster.wait_state(second) == "CANCELLED"
    shown = hpctrain(env, "status", report["study_dir"], "--json")
    statuses = {p["label"]: p["status"] for p in shown.json()["points"]}
    assert statuses["nodes-1"] == "stopped", shown  # it was training: it saved and stopped
    assert statuses["nodes-2"] in ("cancelled", "stopped"), shown  # pending, starting or training when cancelled


def wait_until_training(run_dir: Path, timeout_s: float) -> None:
    """Until the run's summary says it is training (so a cancel then stops a run, not a start)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        summary = read_summary(run_dir)
        if summary is not None and summary.status == "running":
            return
        time.sleep(0.5)
    raise AssertionError(f"{run_dir} did not start training in {timeout_s:.0f} s\n{task_logs(run_dir)}")
