"""``hpctrain submit``'s checks before queueing: pure over a spec, the file
system and a recorded ``scontrol show partition``; and what each sbatch
refusal means."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.contract.slurm_answers import classify_sbatch_failure, parse_partitions
from hpctrain.diagnose.preflight import check_data_root, check_partition, preflight, raise_for_errors
from hpctrain.errors import SpecError
from hpctrain.jobspec.load import load_job

PARTITIONS = """\
PartitionName=debug AllowGroups=ALL Default=YES MaxTime=UNLIMITED State=UP TotalNodes=2
PartitionName=gpu AllowGroups=ALL Default=NO MaxTime=1-00:00:00 State=UP TotalNodes=8
PartitionName=old AllowGroups=ALL Default=NO MaxTime=01:00:00 State=DRAIN TotalNodes=1
"""


pytestmark = pytest.mark.usefixtures("isolated")


def job(tmp_path: Path, root: Path, *sets: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ncluster: slurm\ndata: {{root: {root}}}\n")
    return load_job(path, sets)


def dataset(tmp_path: Path) -> Path:
    for split in ("train", "val"):
        (tmp_path / "data" / split / "a").mkdir(parents=True)
    return tmp_path / "data"


def test_parse_partitions() -> None:
    parts = parse_partitions(PARTITIONS)
    assert sorted(parts) == ["debug", "gpu", "old"]
    assert parts["gpu"]["MaxTime"] == "1-00:00:00" and parts["debug"]["Default"] == "YES"


def test_data_root_missing_beside_a_visible_folder_is_certain(tmp_path: Path) -> None:
    spec = job(tmp_path, tmp_path / "nodata").spec
    assert [(f.level, f.key) for f in check_data_root(spec)] == [("error", "data.root")]


def test_data_root_on_a_mount_the_login_node_lacks_is_a_warning(tmp_path: Path) -> None:
    spec = job(tmp_path, Path("/no-such-mount/imagenet")).spec
    assert [f.level for f in check_data_root(spec)] == ["warning"]


def test_data_root_without_its_splits(tmp_path: Path) -> None:
    (tmp_path / "flat").mkdir()
    (finding,) = check_data_root(job(tmp_path, tmp_path / "flat").spec)
    assert finding.level == "error" and "no train or val folder" in finding.message
    assert check_data_root(job(tmp_path, dataset(tmp_path)).spec) == []


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        ((), []),
        (("resources.partition=nope",), [("error", "resources.partition")]),
        (("resources.partition=gpu", "resources.time=2-00:00:00"), [("error", "resources.time")]),
        (("resources.partition=gpu", "resources.time=24:00:00"), []),
        (("resources.partition=old",), [("warning", "resources.partition")]),
        (("resources.time=30-00:00:00",), []),  # the default partition, MaxTime UNLIMITED
    ],
)
def test_partition_checks(tmp_path: Path, sets: tuple[str, ...], expected: list[tuple[str, str]]) -> None:
    spec = job(tmp_path, dataset(tmp_path), *sets).spec
    assert [(f.level, f.key) for f in check_partition(spec, parse_partitions(PARTITIONS))] == expected


def test_errors_stop_the_submission_with_the_skip_flag(tmp_path: Path) -> None:
    loaded = job(tmp_path, tmp_path / "nodata", "resources.partition=nope")
    findings = preflight(loaded, parse_partitions(PARTITIONS))
    with pytest.raises(SpecError) as info:
        raise_for_errors(loaded, findings)
    assert {p.key for p in info.value.problems} == {"data.root", "resources.partition"}
    assert "--no-preflight" in (info.value.hint or "")
    assert preflight(job(tmp_path, dataset(tmp_path)), None) == []  # no Slurm: partitions unchecked


@pytest.mark.parametrize(
    ("stderr", "meaning", "fix"),
    [
        ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)",
         "did not answer", "nothing was queued"),
        ("sbatch: error: Batch job submission failed: Invalid partition name specified", "partition", "sinfo -s"),
        ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
         "account or QOS", "sacctmgr"),
        ("sbatch: error: Batch job submission failed: Invalid qos specification", "account or QOS", "resources.qos"),
        ("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
         "time limit", "resources.time"),
        ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
         "can ever satisfy", "gpus_per_node"),
        ("sbatch: error: something new", "Slurm refused the job", "sinfo"),
    ],
)  # fmt: skip
def test_sbatch_refusals_are_classified_with_the_fix(stderr: str, meaning: str, fix: str) -> None:
    got_meaning, hint = classify_sbatch_failure(stderr)
    assert meaning in got_meaning and fix in hint
