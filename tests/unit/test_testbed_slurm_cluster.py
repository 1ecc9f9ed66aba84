"""``tests/cluster/slurm-cluster up --shared DIR``: what it refuses, before anything on the machine changes."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.cluster_scripts import load_cluster_script


@pytest.fixture(scope="module")
def cluster() -> ModuleType:
    return load_cluster_script("slurm-cluster")


@pytest.fixture
def tools_present(cluster: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster.shutil, "which", lambda tool, path=None: f"/usr/bin/{Path(tool).name}")


def _refusal(cluster: ModuleType, folder: str, state_dir: Path) -> str:
    with pytest.raises(cluster.ClusterError) as refused:
        cluster.check_shared(folder, cluster.Paths(state_dir))
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.usefixtures("tools_present")
def test_a_missing_folder_is_named_with_the_command_that_makes_it(cluster: ModuleType, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert _refusal(cluster, str(missing), tmp_path / "state") == (
        f"--shared {missing}: no such folder; create it first (mkdir -p {missing})"
    )


@pytest.mark.usefixtures("tools_present")
@pytest.mark.parametrize("folder", ["/", "/usr", "/etc"])
def test_system_folders_are_refused(cluster: ModuleType, tmp_path: Path, folder: str) -> None:
    assert "a system folder" in _refusal(cluster, folder, tmp_path / "state")


@pytest.mark.usefixtures("tools_present")
def test_a_folder_holding_the_state_dir_is_refused(cluster: ModuleType, tmp_path: Path) -> None:
    message = _refusal(cluster, str(tmp_path), tmp_path / "state")
    assert "holds the state dir" in message and "--state-dir" in message


@pytest.mark.usefixtures("tools_present")
def test_a_folder_of_ones_own_is_served_as_its_real_path(cluster: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "data")
    assert cluster.check_shared(str(tmp_path / "link"), cluster.Paths(tmp_path / "state")) == (tmp_path / "data")


def test_missing_sshfs_names_the_packages_to_install(
    cluster: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def which(tool: str, path: str | None = None) -> str | None:
        return None if tool in ("sshfs", cluster.SSHD) else f"/usr/bin/{Path(tool).name}"

    monkeypatch.setattr(cluster.shutil, "which", which)
    message = _refusal(cluster, str(tmp_path), tmp_path / "state")
    assert message == (
        "--shared: openssh-server, sshfs not installed; "
        "apt-get install sshfs openssh-server (scripts/install-testbed.sh does it as root)"
    )


def test_expedited_requeue_is_switched_on_only_where_slurm_has_it(cluster: ModuleType) -> None:
    assert cluster.slurmctld_parameters("26.05") == "SlurmctldParameters=enable_expedited_requeue\n"
    assert cluster.slurmctld_parameters("24.11") == cluster.slurmctld_parameters("22.05") == ""


def test_a_link_rate_is_read_in_tc_units_and_a_wrong_one_names_the_form(cluster: ModuleType) -> None:
    assert cluster.rate_bits("200mbit") == 200e6
    assert cluster.rate_bits("1.5gbit") == 1.5e9
    assert cluster.rate_bits("512kbit") == 512e3
    for wrong in ("200", "fast", "10kbit", "200mbps", "-5mbit"):
        with pytest.raises(cluster.ClusterError, match="e.g. 200mbit"):
            cluster.rate_bits(wrong)
