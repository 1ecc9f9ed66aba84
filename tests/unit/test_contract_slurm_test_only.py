"""``sbatch --test-only`` through the one client: its answers as each recorded Slurm release printed them.

golden/slurm/VERSION/sbatch_test_only_*.txt are ``tests/cluster/record-slurm-outputs``' planner section
(sbatch prints the answer, and its refusals, on stderr).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from hpctrain.contract.slurm import SlurmCommandError, sbatch_test_only_command
from hpctrain.contract.slurm_answers import parse_job_times, parse_test_only
from tests.fake_slurm import FakeSlurm

GOLDEN = Path(__file__).parent / "golden" / "slurm"
RECORDED = sorted(p.name for p in GOLDEN.iterdir() if (p / "sbatch_test_only_now.txt").is_file())


def test_some_release_is_recorded() -> None:
    assert RECORDED, "run tests/cluster/record-slurm-outputs (its planner section)"


@pytest.mark.parametrize("version", RECORDED)
def test_a_start_is_read_from_the_recorded_answer(version: str) -> None:
    found = parse_test_only((GOLDEN / version / "sbatch_test_only_now.txt").read_text())
    assert found is not None and found.partition == "debug" and found.nodes == "n1" and found.processors >= 1
    assert isinstance(found.start, datetime)


@pytest.mark.parametrize("version", [v for v in RECORDED if (GOLDEN / v / "sbatch_test_only_later.txt").is_file()])
def test_a_held_node_puts_the_start_at_its_end(version: str) -> None:
    found = parse_test_only((GOLDEN / version / "sbatch_test_only_later.txt").read_text())
    held = parse_job_times((GOLDEN / version / "squeue_times_running.txt").read_text())  # the node's holder
    assert held is not None and held.end is not None
    end = held.end
    assert found is not None and found.nodes == "n[1-2]" and abs((found.start - end).total_seconds()) <= 2


def test_text_without_a_start_is_none() -> None:
    assert parse_test_only("sbatch: error: Batch job submission failed") is None
    assert (
        parse_test_only("Job 3 to start at 2026-13-45T99:00:00 using 1 processors on nodes n1 in partition p") is None
    )


def test_the_argv_is_sbatch_test_only_with_the_options() -> None:
    argv = sbatch_test_only_command([("nodes", 2), ("exclusive", True), ("qos", None), ("account", ""), ("time", 60)])
    assert argv == ["sbatch", "--test-only", "--nodes=2", "--exclusive", "--time=60", "--wrap", "true"]


@pytest.mark.parametrize("version", RECORDED)
@pytest.mark.parametrize(
    ("recording", "meaning"),
    [
        ("sbatch_test_only_too_many_nodes.txt", "no node can ever satisfy the request"),
        ("sbatch_test_only_gres.txt", "no node can ever satisfy the request"),
        ("sbatch_test_only_invalid_partition.txt", "the partition does not exist"),
    ],
)
def test_refusals_say_what_they_mean(version: str, recording: str, meaning: str) -> None:
    fake = FakeSlurm()
    fake.test_only_answers = {1: (1, (GOLDEN / version / recording).read_text())}
    with pytest.raises(SlurmCommandError) as caught:
        fake.client().test_only([("nodes", 1)])
    assert caught.value.kind == "refused" and meaning in caught.value.message and caught.value.hint


def test_the_answer_on_stderr_is_read() -> None:
    fake = FakeSlurm()
    fake.test_only_answers = {2: (0, (GOLDEN / RECORDED[0] / "sbatch_test_only_now.txt").read_text())}
    assert fake.client().test_only([("nodes", 2)]).partition == "debug"
    fake.test_only_answers = {2: (0, "sbatch: something else\n")}
    with pytest.raises(SlurmCommandError, match="named no start time"):
        fake.client().test_only([("nodes", 2)])
