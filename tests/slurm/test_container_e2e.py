"""A job whose tasks run inside a "container" without scontrol still requeues itself and resumes.

Neither pyxis nor Apptainer can be installed on the test cluster (Debian 12
packages neither, and there is no registry to pull images from), so a
stand-in ``apptainer`` on the nodes' PATH takes the place of the real one: it
checks the command line hpctrain renders (``exec [--nv] --bind M --pwd D
IMAGE CMD...``), enters the directory, and runs CMD with a PATH on which only
the job's Python lies: no ``scontrol``, as in an image without Slurm. The
time-limit requeue must then go through the batch step's relay.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .hpctrain_cli import task_logs
from .stop_helpers import (
    EPOCHS,
    STEPS_PER_EPOCH,
    Workspace,
    latest_step,
    make_workspace,
    report_timing,
    submit,
    wait_for,
    wait_requeued,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

FAKE_APPTAINER = """#!/bin/bash
# stand-in for apptainer: exec [--nv] --bind MOUNTS --pwd DIR IMAGE CMD...
[ "$1" = exec ] || { echo "fake apptainer: expected exec, got $1" >&2; exit 97; }; shift
[ "$1" = --nv ] && shift
[ "$1" = --bind ] || { echo "fake apptainer: expected --bind, got $1" >&2; exit 98; }; shift 2
[ "$1" = --pwd ] || { echo "fake apptainer: expected --pwd, got $1" >&2; exit 99; }; cd "$2" || exit 95; shift 2
[ -f "$1" ] || { echo "fake apptainer: no image $1" >&2; exit 96; }; shift
export PATH="$HPCTRAIN_FAKE_IMAGE_PATH" HPCTRAIN_INSIDE_FAKE_IMAGE=1
exec "$@"
"""


@pytest.fixture(scope="module")
def workspace(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    tmp = tmp_path_factory.mktemp("container")
    ws = make_workspace(slurm_cluster, tmp)
    tools = tmp / "host-bin"
    tools.mkdir()
    (tools / "apptainer").write_text(FAKE_APPTAINER)
    (tools / "apptainer").chmod(0o755)
    (tmp / "image.sif").write_bytes(b"")
    ws.env["PATH"] = f"{tools}:{ws.env['PATH']}"
    ws.env["HPCTRAIN_FAKE_IMAGE_PATH"] = str(Path(sys.executable).parent)  # the venv's bin: python, no scontrol
    ws.env["HPCTRAIN_TEST_IMAGE"] = str(tmp / "image.sif")
    return ws


def test_requeue_from_inside_an_image_without_scontrol(slurm_cluster: SlurmCluster, workspace: Workspace) -> None:
    assert not (Path(sys.executable).parent / "scontrol").exists()
    started = time.monotonic()
    run = submit(
        workspace,
        "name=in_container",
        "container.runtime=apptainer",
        f"container.image={workspace.env['HPCTRAIN_TEST_IMAGE']}",
        f"container.python={sys.executable}",
    )
    wait_for(lambda: latest_step(run.run_dir) >= 2 or None, "the first checkpoint", 120, run)
    slurm_cluster.run("scancel", "--signal=USR2", run.job_id)  # the time-limit warning
    wait_requeued(slurm_cluster, run.job_id, restarts=1, timeout=90)
    slurm_cluster.release(run.job_id)
    state = slurm_cluster.wait_state(run.job_id, timeout=180)
    assert state == "COMPLETED", task_logs(run.run_dir)
    summary = run.summary()
    assert (summary["status"], summary["global_step"], summary["restarts"]) == (
        "completed",
        EPOCHS * STEPS_PER_EPOCH,
        1,
    ), summary
    relay = run.run_dir / ".hpctrain" / "slurm-relay" / run.job_id
    assert relay.is_dir() and not [p.name for p in relay.iterdir()], "every request was answered and collected"
    logs = task_logs(run.run_dir, lines=400)
    # Rank 0 saw the job's state through the relay ("scontrol show job": no scontrol in the
    # image) and chose to requeue; restarts == 1 above is the requeue itself. Its own
    # "requeued Slurm job" line is not waited for: the requeue ends the step, and through
    # the relay's polling that often comes before scontrol's answer reaches rank 0.
    assert "job is running: requeue" in logs, logs
    report_timing("container job with a relayed requeue, submit to end", time.monotonic() - started)
