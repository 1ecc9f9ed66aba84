"""``hpctrain doctor`` and ``submit``'s preflight against the real cluster: each doomed job is caught
before anything is queued, with the fix named; the probe job reports from a compute node, including
how many files per second data.root serves it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .hpctrain_cli import cli_env, hpctrain, make_dataset

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# alone (it reads the queue or stops the controller): on 24.11's alone half again since rehearsal 21, whose side
# stream ended ~150 s after 24.11's legs (docs/testing.md, `slurm_side`)

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("doctor")
    env = cli_env(slurm_cluster, tmp / "state")
    make_dataset(env, tmp / "data", classes=2, per_class=4, image_size=16)
    return {"env": env, "data": tmp / "data", "runs": tmp / "runs", "tmp": tmp}


def sets(ws: dict, *extra: str) -> list[str]:
    args = []
    for item in (f"data.root={ws['data']}", f"output_dir={ws['runs']}", *extra):
        args += ["--set", item]
    return args


def doctor(ws: dict, *extra: str, probe: bool = False) -> tuple[int, dict]:
    done = hpctrain(ws["env"], "doctor", SMOKE_SPEC, "--json", *(["--probe"] if probe else []), *sets(ws, *extra),
                    timeout=240)  # fmt: skip
    assert "Traceback" not in done.stderr, done
    return done.returncode, json.loads(done.stdout)


def errors(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"] if check["level"] == "error"}


def queued(cluster: SlurmCluster) -> list[str]:
    return cluster.run("squeue", "-h", "-o", "%i").stdout.split()


def assert_submit_refused(ws: dict, cluster: SlurmCluster, *extra: str, says: str) -> None:
    before = queued(cluster)
    done = hpctrain(ws["env"], "submit", SMOKE_SPEC, *sets(ws, *extra), timeout=180)
    assert done.returncode != 0, done
    assert says in done.stderr and "Traceback" not in done.stderr, done
    assert queued(cluster) == before, "nothing may be queued"
    assert not ws["runs"].exists() or not any(ws["runs"].rglob("run.json")), "no run directory may be left"


def test_a_sound_spec_passes_and_the_probe_reports_from_a_node(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    code, report = doctor(workspace, probe=True)
    assert code == 0 and report["ok"], report
    names = {check["name"]: check["level"] for check in report["checks"]}
    assert names["controller"] == names["accounting"] == names["resources.partition"] == "ok"
    probe = report["probe"]
    assert probe["hostname"] in slurm_cluster.nodes and probe["state"] == "COMPLETED", probe
    assert probe["data_root_readable"] and probe["output_dir_writable"] and probe["torch"]
    # make-dataset wrote 2 classes x 4 images: the node measured every training file, once each
    rate = next(check for check in report["checks"] if check["name"] == "data.root rate")
    assert rate["level"] == "ok" and rate["detail"].startswith(f"from {probe['hostname']}"), rate
    assert rate["numbers"]["stats"] + rate["numbers"]["opens"] == 8 and rate["numbers"]["stopped_by"] == "tree"
    assert probe["file_rate"]["classes"] == 2 and probe["file_rate"]["samples_per_s"] > 0


def test_time_above_max_time(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    extra = ("resources.partition=short", "resources.time=00:10:00")
    code, report = doctor(workspace, *extra)
    assert code == 1 and "MaxTime 00:02:00" in errors(report)["resources.time"]["detail"]
    preemption = next(c for c in report["checks"] if c["name"] == "preemption")
    assert preemption["level"] == "warning" and "GraceTime 0 s" in preemption["detail"]
    assert_submit_refused(workspace, slurm_cluster, *extra, says="MaxTime")


def test_gpus_the_partition_does_not_have(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    code, report = doctor(workspace, "resources.gpus_per_node=2", "distributed.backend=gloo")
    assert code == 1 and "2 GPUs per node" in errors(report)["resources"]["detail"]
    assert_submit_refused(workspace, slurm_cluster, "resources.gpus_per_node=2", says="sbatch")


def test_missing_data_root(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    missing = f"data.root={workspace['tmp'] / 'no-such-data'}"
    code, report = doctor(workspace, missing)
    assert code == 1 and "does not exist" in errors(report)["data.root"]["detail"]
    assert_submit_refused(workspace, slurm_cluster, missing, says="data.root")


def test_output_dir_on_tmpfs(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    shm = Path("/dev/shm") / f"hpctrain-doctor-{workspace['tmp'].name}"
    try:
        code, report = doctor(workspace, f"output_dir={shm}")
        assert code == 1 and "tmpfs" in errors(report)["output_dir"]["detail"]
        before = queued(slurm_cluster)
        done = hpctrain(workspace["env"], "submit", SMOKE_SPEC, *sets(workspace), "--set", f"output_dir={shm}")
        assert done.returncode == 2 and "shared file system" in done.stderr, done
        assert queued(slurm_cluster) == before and not shm.exists()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


def test_stopped_controller(workspace: dict, slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.stop_controller()
    try:
        code, report = doctor(workspace)
        assert code == 1 and "admins" in errors(report)["controller"]["fix"], report
        done = hpctrain(workspace["env"], "submit", SMOKE_SPEC, *sets(workspace), timeout=240)
        assert done.returncode != 0 and "controller did not answer" in done.stderr, done
        assert "Traceback" not in done.stderr
    finally:
        slurm_cluster.repair()
    assert queued(slurm_cluster) == []
