"""A packed dataset image on the real cluster: each node mounts it once, nothing stays mounted.

NOT RUN YET: written while another engineer held the Slurm test cluster
(issue 21); run it with the rest of the Slurm tier before relying on it.

The test cluster's nodes share this machine's disk, so the stage dir names
the node (``{node}``): each node mounts under its own folder, as on a real
cluster where ``$SLURM_TMPDIR`` is a node's local disk. /proc/mounts is read
on this machine, which the nodes' mounts share.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import summary_path
from tests.squashfs_tools import require_mount

from .hpctrain_cli import cli_env, data_sets, hpctrain, make_dataset, submit_json, task_logs, task_output

if TYPE_CHECKING:
    from .conftest import SlurmCluster

# Safe beside other tests on the one cluster (conftest.py: slurm_shared; scripts/test.sh runs these two at a time).
pytestmark = pytest.mark.slurm_shared

SMOKE_SPEC = "jobs/smoke_2x2_cpu.yaml"
UNMOUNT_BUDGET_S = 60  # after the job ended (or was cancelled), its mounts are gone this much later


def _mount_lines() -> set[str]:
    """This machine's mount table and the nodes': from Slurm 24.11 on, the test cluster's slurmd run in
    their root filesystem's own mount namespace, where the tasks' squashfuse mounts are made."""
    tables, seen = [Path("/proc/self/mounts")], {os.stat("/proc/self/ns/mnt").st_ino}
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or (proc / "comm").read_text().strip() != "slurmd":
                continue
            namespace = os.stat(proc / "ns" / "mnt").st_ino
        except OSError:
            continue
        if namespace not in seen:
            seen.add(namespace)
            tables.append(proc / "mounts")
    lines: set[str] = set()
    for table in tables:
        try:
            lines.update(table.read_text().splitlines())
        except OSError:
            pass  # that slurmd has just ended
    return lines


def _mounts_under(folder: Path) -> list[str]:
    return sorted(line for line in _mount_lines() if str(folder) in line)


def _wait_no_mounts(folder: Path) -> None:
    deadline = time.monotonic() + UNMOUNT_BUDGET_S
    while _mounts_under(folder) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _mounts_under(folder), _mounts_under(folder)


def test_two_nodes_train_on_a_packed_image_and_leave_nothing_mounted(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    require_mount()
    env = cli_env(slurm_cluster, tmp_path / "state")
    data, image, stage = tmp_path / "data", tmp_path / "data.sqsh", tmp_path / "stage"
    for node in slurm_cluster.nodes:
        (stage / node).mkdir(parents=True)  # a stage dir is never created
    make_dataset(env, data)
    packed = hpctrain(env, "pack", str(data), str(image))
    assert packed.returncode == 0, packed
    data.rename(tmp_path / "moved-away")  # the job must read the image only

    def submit(*extra: str, wait: bool = True) -> Path:
        sets = data_sets(image, tmp_path / "runs", f"data.stage_dir={stage}/{{node}}")
        done, report = submit_json(env, SMOKE_SPEC, *sets, *extra, *(["--wait"] if wait else []), timeout=300)
        run_dir = Path(report["run_dir"])
        assert done.returncode == 0, f"{done}\n{task_logs(run_dir)}"
        return run_dir

    run = submit("--set", "trainer.epochs=1")
    summary = json.loads(summary_path(run).read_text())
    assert summary["status"] == "completed" and summary["skipped_samples"] == 0, summary
    output = task_output(run)
    assert output.count("hpctrain: data: mounted") == 2, output  # once per node, by its first task
    assert output.count("reading the image") == 4, output  # every rank reads the mount
    assert sorted(p.name for p in stage.iterdir()) == ["n1", "n2"]
    _wait_no_mounts(stage)
    # each node's last task unmounted before it exited (the step's end kills squashfuse with the rest)
    assert output.count("(the node's last task to end)") == 2, output

    # Cancelled while training: the mounts are gone on both nodes too.
    long_run = submit("--set", "trainer.epochs=50", "--set", "trainer.max_steps_per_epoch=1000", wait=False)
    deadline = time.monotonic() + 180
    while task_output(long_run).count("hpctrain: data: mounted") < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(_mounts_under(stage)) == 2, task_output(long_run)
    cancelled = hpctrain(env, "cancel", str(long_run), timeout=120)
    assert cancelled.returncode == 0, cancelled
    _wait_no_mounts(stage)
