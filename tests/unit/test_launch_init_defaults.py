"""``hpctrain init``'s defaults follow where you are (hpctrain/launch/init_defaults.py): pure choices over a Here."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.launch.init_defaults import CLUSTER_VAR, Here, choose, gpus_here

LAPTOP = Here(slurm=False, slurm_cluster="", gpus=0)
WORKSTATION = Here(slurm=False, slurm_cluster="", gpus=2)
HAL_LOGIN = Here(slurm=True, slurm_cluster="hal", gpus=0)
OTHER_SLURM = Here(slurm=True, slurm_cluster="campus", gpus=0)


def pick(here: Here, environ: dict[str, str] | None = None, **flags: object) -> tuple[str, int, int | None]:
    given = {"cluster": None, "gpus_per_node": None, "tasks_per_node": None, **flags}
    chosen = choose(here, environ or {}, **given)  # type: ignore[arg-type]
    return chosen.cluster, chosen.gpus_per_node, chosen.tasks_per_node


@pytest.mark.parametrize(
    ("here", "expected"),
    [
        (LAPTOP, ("local", 0, None)),  # no Slurm, no GPU: a CPU job here, never HAL's 4 GPUs
        (WORKSTATION, ("local", 2, None)),  # the GPUs this machine shows
        (HAL_LOGIN, ("hal", 4, None)),  # Slurm's ClusterName names a profile: that profile and its GPUs
        (OTHER_SLURM, ("slurm", 0, None)),  # any other Slurm cluster: the generic profile
    ],
)
def test_the_defaults_are_those_of_the_machine(here: Here, expected: tuple[str, int, None]) -> None:
    assert pick(here) == expected


def test_flags_and_the_environment_win() -> None:
    assert pick(LAPTOP, {CLUSTER_VAR: "hal"}) == ("hal", 4, None)
    assert pick(HAL_LOGIN, cluster="local") == ("local", 0, None)
    assert pick(LAPTOP, tasks_per_node=2) == ("local", 0, 2)
    assert pick(OTHER_SLURM, gpus_per_node=8) == ("slurm", 8, None)
    assert (
        "cluster local: no Slurm here" in choose(LAPTOP, {}, cluster=None, gpus_per_node=None, tasks_per_node=None).why
    )


def test_a_local_job_cannot_ask_for_gpus_the_machine_lacks() -> None:
    with pytest.raises(UsageError, match="--gpus-per-node 4: this machine shows 0 GPUs") as err:
        pick(LAPTOP, cluster="local", gpus_per_node=4)
    assert "--gpus-per-node 0" in (err.value.hint or "") and "--tasks-per-node" in (err.value.hint or "")
    assert pick(WORKSTATION, cluster="local", gpus_per_node=2) == ("local", 2, None)
    with pytest.raises(UsageError, match="unknown cluster profile"):
        pick(LAPTOP, cluster="nowhere")


def test_gpus_here_counts_the_drivers_gpus_within_cuda_visible_devices(tmp_path: Path) -> None:
    assert gpus_here({}, tmp_path / "absent") == 0
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (tmp_path / bus).mkdir()
    assert gpus_here({}, tmp_path) == 3
    assert gpus_here({"CUDA_VISIBLE_DEVICES": "0"}, tmp_path) == 1
    assert gpus_here({"CUDA_VISIBLE_DEVICES": ""}, tmp_path) == 0
    assert gpus_here({"CUDA_VISIBLE_DEVICES": "-1"}, tmp_path) == 0
