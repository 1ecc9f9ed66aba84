"""A packed dataset image on the real cluster: each node mounts it once, nothing stays mounted.

The test cluster's nodes share this machine's disk, so the stage dir names
the node (``{node}``): each node mounts under its own folder, as on a real
cluster where ``$SLURM_TMPDIR`` is a node's local disk. /proc/mounts is read
on this machine, which the nodes' mounts share.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Collection
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
CANCEL_TRIES = 3  # cancels whose tasks Slurm killed before they could act prove nothing: another one (below)


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


def _wait_no_mounts(folder: Path, ignore: Collection[str] = ()) -> list[str]:
    """Wait (bounded) until nothing but ``ignore`` is mounted under ``folder``; what is left."""
    deadline = time.monotonic() + UNMOUNT_BUDGET_S
    while (left := [m for m in _mounts_under(folder) if m not in ignore]) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def _unfinished_nodes(run_dir: Path) -> set[str]:
    """The nodes where some task of the run never reached its own end (submitit's last line): Slurm killed it."""
    nodes = set()
    for log in run_dir.rglob("*_log.out"):
        text = log.read_text(errors="replace")
        host = re.search(r"JobEnvironment\(job_id=\S+, hostname=([^,\s]+)", text)
        if host is not None and "Exiting after successful completion" not in text:
            nodes.add(host.group(1))
    return nodes


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
    assert sorted(p.name for p in stage.iterdir()) == sorted(slurm_cluster.nodes)
    assert _wait_no_mounts(stage) == []
    # each node's last task unmounted before it exited (the step's end kills squashfuse with the rest)
    assert output.count("(the node's last task to end)") == 2, output

    # Cancelled while training: the mounts are gone on both nodes too, once the tasks stopped. Slurm SIGKILLs
    # a task KillWait after the cancel's SIGTERM (5 s on the test cluster; 30 s is Slurm's default), and
    # proctrack/cgroup kills the detached watcher and squashfuse with it: a node whose task was still
    # finishing its step then (3-4 s a step beside CI's other legs: rehearsal 30) keeps a dead mount until a
    # later start on it (docs/data.md). Such a cancel proves nothing either way: another one, at most
    # CANCEL_TRIES. A mount left on a node whose every task ended is a failure at once.
    stale: list[str] = []
    for _ in range(CANCEL_TRIES):
        long_run = submit("--set", "trainer.epochs=50", "--set", "trainer.max_steps_per_epoch=1000", wait=False)
        deadline = time.monotonic() + 180
        while task_output(long_run).count("hpctrain: data: mounted") < 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert len([m for m in _mounts_under(stage) if m not in stale]) == 2, task_output(long_run)
        cancelled = hpctrain(env, "cancel", str(long_run), timeout=120)
        assert cancelled.returncode == 0, cancelled
        left = _wait_no_mounts(stage, ignore=stale)
        if not left:
            break
        killed = _unfinished_nodes(long_run)
        on_finished = [m for m in left if not any(f"/{node}/" in m for node in killed)]
        assert not on_finished, f"mounts left on nodes whose tasks all ended: {on_finished}\n{task_output(long_run)}"
        stale += left
    else:
        pytest.fail(f"Slurm killed a node's tasks before they stopped in all {CANCEL_TRIES} cancels: {stale}")
