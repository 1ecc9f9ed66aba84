"""The data and checkpoint paths on a filesystem that is really remote, as Lustre or NFS is.

``slurm-cluster up --shared DIR`` serves DIR from the host over the bridge
(sshd and OpenSSH's sftp-server) and mounts it with sshfs at the same path on
each node, in that node's own mount namespace. The dataset and ``output_dir``
lie there, so every sample a rank reads and every checkpoint file rank 0
writes crosses the network, one file at a time. The sftp server logs each
open, listing and rename per node: what the tests read to prove it.

The same deterministic job as test_preemption_e2e.py: one uninterrupted run
reads the tree directly; a second stages it on each node's local disk, is
requeued by USR2, and must end with the first one's weights, bit for bit.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hpctrain.contract.rundir import checkpoints_dir

from .hpctrain_cli import task_logs, task_output
from .stop_helpers import (
    STEPS_PER_EPOCH,
    TASKS_PER_NODE,
    Run,
    Workspace,
    assert_completed_exactly,
    latest_step,
    make_workspace,
    report_timing,
    submit,
    temp_checkpoint_dirs,
    wait_for,
    wait_requeued,
)

if TYPE_CHECKING:
    from .conftest import SlurmCluster

RUN_TIMEOUT_S = 180  # a hang guard: sshfs makes every file open a round trip
# The server's log is read for the trainer's own data path: the burn-in's read probe (each node lists a
# few class folders and reads its share of their files through the mount, docs/node-health.md) would
# be counted with it, so these jobs run without it; the node-health test covers the burn-in.
NO_BURN_IN = ("health.burn_in.enabled=false",)
START_TIMEOUT_S = 120
SERVER_LINE = re.compile(r'^(open|opendir|rename|posix-rename) (?:old )?"([^"]*)"(?: flags (\S+)| new "([^"]*)")?')

pytestmark = pytest.mark.shared_fs
CLUSTER_SHAPE = "shared"  # conftest.py: this file runs with the others that need it, after the default's


class ServerLog:
    """What the sftp server did for each node's mount from now on (its log, read from the current end)."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.logs = {node: cluster.sftp_log(node) for node in cluster.nodes}
        self.start = {node: log.stat().st_size if log.exists() else 0 for node, log in self.logs.items()}

    def lines(self, node: str) -> list[tuple[str, str, str]]:
        """(operation, path, flags or the rename's new path) per line since this object was made."""
        with open(self.logs[node], "rb") as f:
            f.seek(self.start[node])
            text = f.read().decode(errors="replace")
        found = []
        for line in text.splitlines():
            match = SERVER_LINE.match(line)
            if match:
                op, path, flags, new = match.groups()
                found.append((op, path, flags or new or ""))
        return found

    def opened(self, node: str, under: Path, flag: str) -> set[str]:
        return {p for op, p, flags in self.lines(node) if op == "open" and p.startswith(f"{under}/") and flag in flags}

    def renamed(self, node: str, under: Path) -> list[tuple[Path, Path]]:
        """(old, new) of every rename of a path under ``under``."""
        moves = [(Path(old), Path(new)) for op, old, new in self.lines(node) if "rename" in op]
        return [(old, new) for old, new in moves if under in old.parents]


@pytest.fixture(scope="module")
def shared(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """A workspace (dataset, runs) in a folder every node mounts over sshfs (conftest.py: the next file
    that needs the default cluster asks for it)."""
    folder = tmp_path_factory.mktemp("shared")
    started = time.monotonic()
    slurm_cluster.use_shared(folder)
    report_timing("cluster restarted with --shared", time.monotonic() - started)
    return make_workspace(slurm_cluster, folder)


@pytest.fixture(scope="module")
def reference(slurm_cluster: SlurmCluster, shared: Workspace) -> tuple[Run, ServerLog]:
    """The uninterrupted run, reading the tree over the mount; what the server logged during it."""
    started = time.monotonic()
    server = ServerLog(slurm_cluster)
    run = submit(shared, "name=uninterrupted_on_shared", *NO_BURN_IN)
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    report_timing("uninterrupted run on the shared mount", time.monotonic() - started)
    return run, server


def test_samples_cross_the_network_and_only_the_leader_scans(
    slurm_cluster: SlurmCluster, shared: Workspace, reference: tuple[Run, ServerLog]
) -> None:
    run, server = reference
    summary = run.summary()
    assert (summary["status"], summary["restarts"]) == ("completed", 0), summary
    train = shared.data / "train"
    for node in slurm_cluster.nodes:
        read = server.opened(node, train, "READ")
        # Its ranks' steps of an epoch take distinct samples (batch 2): at least that many files each node read.
        least = TASKS_PER_NODE * STEPS_PER_EPOCH * 2
        assert len(read) >= least and all(p.endswith(".jpg") for p in read), (node, least, sorted(read))
    listed = {node: {p for op, p, _ in server.lines(node) if op == "opendir" and p.startswith(str(train))}
              for node in slurm_cluster.nodes}  # fmt: skip
    classes = {str(p) for p in train.iterdir()}
    assert listed == {"n1": classes | {str(train)}, "n2": set()}, "rank 0 (on n1) lists the tree; no other rank does"


def test_checkpoints_reach_the_server_complete_or_not_at_all(
    slurm_cluster: SlurmCluster, reference: tuple[Run, ServerLog]
) -> None:
    run, server = reference
    checkpoints = checkpoints_dir(run.run_dir)
    written = server.opened("n1", checkpoints, "WRITE")
    assert written, "rank 0 wrote its checkpoints through the mount"
    # No file is written under its final name: each lies in a temp folder or is a temp file (best.json's).
    in_place = [p for p in written if not Path(p).relative_to(checkpoints).parts[0].startswith(".")]
    assert in_place == [], in_place
    renamed = server.renamed("n1", checkpoints)
    installed = {new.name for old, new in renamed if old.name.startswith(".tmp-step-")}
    assert installed and {p.name for p in checkpoints.glob("step-*")} <= installed, renamed
    # The only other renames: a temp file into place (best.json), an old step retired before its deletion,
    # and FUSE hiding a deleted file that is still open (NFS's `.nfsXXXX`): a retired step's state.pt that
    # a data-loader worker, forked while the background writer hashed it, still holds.
    others = [
        (old, new)
        for old, new in renamed
        if not old.name.startswith((".tmp-step-", f".{new.name}."))
        and not new.name.startswith((".old-", ".fuse_hidden"))
    ]
    assert others == [], others
    assert not server.opened("n2", checkpoints, "WRITE"), "only rank 0 writes checkpoints"
    assert temp_checkpoint_dirs(run.run_dir) == []


def test_staged_run_requeued_by_usr2_resumes_bit_identically(
    slurm_cluster: SlurmCluster, shared: Workspace, reference: tuple[Run, ServerLog], tmp_path: Path
) -> None:
    started = time.monotonic()
    server = ServerLog(slurm_cluster)
    stage = tmp_path / "stage"  # the nodes' local disks: outside the shared folder
    for node in slurm_cluster.nodes:
        (stage / node).mkdir(parents=True)  # a stage dir is never created
    run = submit(
        shared, "name=staged_requeued_on_shared", "data.stage=node", f"data.stage_dir={stage}/{{node}}", *NO_BURN_IN
    )
    wait_for(lambda: latest_step(run.run_dir) >= 2, "the first checkpoint", START_TIMEOUT_S, run)
    slurm_cluster.run("scancel", "--signal=USR2", run.job_id)
    wait_requeued(slurm_cluster, run.job_id, restarts=1)
    slurm_cluster.release(run.job_id)
    assert slurm_cluster.wait_state(run.job_id, timeout=RUN_TIMEOUT_S) == "COMPLETED", task_logs(run.run_dir)
    report_timing("staged run on the shared mount, USR2-requeued, submit to end", time.monotonic() - started)

    assert_completed_exactly(run, 1, reference[0].summary()["weights_sha256"])
    images = {str(p) for p in shared.data.rglob("*.jpg")}
    for node in slurm_cluster.nodes:
        # Each node copied the whole tree over the network once, then read only its local copy.
        copied = server.opened(node, shared.data, "READ")
        assert copied == images, f"{node} read {len(copied)} of the {len(images)} images through the mount"
        opens = [p for op, p, flags in server.lines(node) if op == "open" and p in images]
        assert len(opens) == len(images), f"{node} read some images more than once: the second attempt re-staged"
    output = task_output(run.run_dir)
    assert output.count("staged already") == 2, output  # the requeued attempt, once per node
