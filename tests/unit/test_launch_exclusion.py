"""What submit excludes (launch/exclusion.py): the ledger's live nodes of the cluster, trimmed to fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.contract import bad_nodes
from hpctrain.contract.slurm import SlurmCommandError
from hpctrain.jobspec.load import load_job
from hpctrain.launch.dry_run import dry_run
from hpctrain.launch.exclusion import plan_exclusion

SPEC = """\
name: ex
cluster: slurm
data: {root: /datasets/x}
resources: {nodes: 2, spare_nodes: 1, tasks_per_node: 1, gpus_per_node: 0, partition: debug}
"""


@pytest.fixture
def job(tmp_path: Path, isolated: Path):  # noqa: ANN201
    (tmp_path / "job.yaml").write_text(SPEC)
    return load_job(tmp_path / "job.yaml")


def listed(*nodes: str, cluster: str = "slurm") -> None:
    for index, node in enumerate(nodes):
        entry = bad_nodes.new_entry(
            node, cluster=cluster, reason="slurmd gone", kind="lost", evidence={}, run="r", job_id="1"
        )
        entry.time += index  # listed in this order
        bad_nodes.append_entries([entry])


def test_live_nodes_of_the_cluster_are_excluded_and_said(job) -> None:  # noqa: ANN001
    listed("n2", "n9")
    listed("n5", cluster="elsewhere")
    found = plan_exclusion(job, available=lambda partition: ["n1", "n2", "n3", "n4", "n6", "n9"])
    assert found.nodes == ("n2", "n9")
    assert "excluding n2 (bad-node ledger: lost: slurmd gone)" in found.notes
    assert plan_exclusion(job, use_ledger=False).nodes == ()


def test_a_list_the_partition_cannot_satisfy_is_trimmed_to_the_newest(job) -> None:  # noqa: ANN001
    listed("n1", "n2", "n3")
    found = plan_exclusion(job, available=lambda partition: ["n1", "n2", "n3", "n4"])  # the job needs 3
    assert found.nodes == ("n3",)
    assert any("not excluding n1,n2 (the oldest entries)" in note for note in found.notes), found.notes


def test_nodes_not_in_the_partition_are_left_out_and_slurm_trouble_excludes_all(job) -> None:  # noqa: ANN001
    listed("n2", "x7")
    assert plan_exclusion(job, available=lambda partition: ["n1", "n2", "n3", "n4", "n5"]).nodes == ("n2",)

    def refuses(partition: str | None) -> list[str]:
        raise SlurmCommandError("sinfo failed", kind="unreachable")

    found = plan_exclusion(job, available=refuses)
    assert found.nodes == ("n2", "x7") and any("could not count" in note for note in found.notes)


def test_the_dry_run_shows_the_exclude_line_and_why(job) -> None:  # noqa: ANN001
    listed("n2")
    shown = dry_run(job).text
    assert "#SBATCH --exclude=n2" in shown and "# excluding n2 (bad-node ledger: lost: slurmd gone)" in shown
    assert "--exclude" not in dry_run(job, exclude_bad_nodes=False).text


def test_a_broken_ledger_never_stops_a_submit(job, tmp_path: Path) -> None:  # noqa: ANN001
    path = tmp_path / "state" / "hpctrain" / "bad-nodes.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00" * 100 + b"\n{oops\n")
    found = plan_exclusion(job, available=lambda partition: ["n1", "n2", "n3"])
    assert found.nodes == () and "2 line(s) that are not ledger entries" in found.notes[0]


GPU_SPEC = """\
name: ex
cluster: slurm
data: {root: /datasets/x}
resources: {nodes: 2, gpus_per_node: 4, cpus_per_task: 10, partition: debug}
"""


def test_a_submit_counts_only_the_nodes_that_hold_one_of_the_jobs_nodes(
    tmp_path: Path, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partition has 4 usable nodes, but n3 and n4 have 2 GPUs: for a job of 4 GPUs (4 tasks x 10 CPUs) a
    node only n1 and n2 count, so the ledger's n2 cannot be excluded (the job would pend forever)."""
    from hpctrain.jobscript.parameters import node_needs
    from hpctrain.launch.submission import bad_node_exclusion
    from tests.fake_slurm import FakeSlurm

    (tmp_path / "job.yaml").write_text(GPU_SPEC)
    gpu_job = load_job(tmp_path / "job.yaml")
    assert (node_needs(gpu_job.spec).gpus, node_needs(gpu_job.spec).cpus) == (4, 40)
    fake = FakeSlurm(partition={"n1": "idle", "n2": "idle", "n3": "idle", "n4": "mixed"})
    fake.node_gres = {"n1": "gpu:v100:4(S:0-1)", "n2": "gpu:v100:4(S:0-1)", "n3": "gpu:2", "n4": "gpu:2"}
    fake.node_cpus = dict.fromkeys(fake.partition, 160)
    fake.install(monkeypatch)
    listed("n2")
    found = bad_node_exclusion(gpu_job, "slurm", use_ledger=True)
    assert found.nodes == ()
    assert any("lists 1 of the 2 usable nodes of partition debug, but the job needs 2" in n for n in found.notes), (
        found.notes
    )
