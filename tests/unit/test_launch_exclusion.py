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
