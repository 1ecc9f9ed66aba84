"""``tests/cluster/slurm-cluster`` instances: two test clusters on one machine, apart in everything they own."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.cluster_scripts import load_cluster_script


def load(monkeypatch: pytest.MonkeyPatch, instance: str | None) -> ModuleType:
    if instance is None:
        monkeypatch.delenv("HPCTRAIN_SLURM_INSTANCE", raising=False)
    else:
        monkeypatch.setenv("HPCTRAIN_SLURM_INSTANCE", instance)
    return load_cluster_script("slurm-cluster")


def owned(cluster: ModuleType) -> dict[str, object]:
    nodes = cluster.node_names(3)
    return {
        "nodes": tuple(nodes),
        "addresses": tuple(cluster.node_addr(n) for n in nodes),
        "host": cluster.HOST_ADDR,
        "bridge": cluster.BRIDGE,
        "netns": tuple(cluster.netns_name(n) for n in nodes),
        "veths": tuple(cluster.veth_name(n) for n in nodes),
        "ports": (cluster.CTLD_PORT, cluster.DBD_PORT, cluster.SSHD_PORT),
        "state": cluster.DEFAULT_STATE_DIR,
        "marker": cluster.ACTIVE_MARKER,
        "hosts_tag": cluster.HOSTS_TAG,
        "wrappers": cluster.WRAPPER_DIR,
        "first_job": cluster.FIRST_JOB_ID,
    }


def test_instance_0_is_the_cluster_as_it_always_was(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = load(monkeypatch, None)
    assert cluster.node_names(2) == ["n1", "n2"] and cluster.hostlist(cluster.node_names(4)) == "n[1-4]"
    assert (cluster.HOST_ADDR, cluster.BRIDGE, cluster.CTLD_PORT) == ("10.213.7.1", "hpctr-br0", 6817)
    assert cluster.DEFAULT_STATE_DIR == "/tmp/hpctrain-slurm"
    assert str(cluster.WRAPPER_DIR) == "/usr/local/bin"
    assert cluster.FIRST_JOB_ID == 1


def test_two_instances_share_nothing_they_own(monkeypatch: pytest.MonkeyPatch) -> None:
    zero, one = owned(load(monkeypatch, "0")), owned(load(monkeypatch, "1"))
    for key in zero:
        assert zero[key] != one[key], key
        if isinstance(zero[key], tuple):
            assert not set(zero[key]) & set(one[key]), key  # type: ignore[arg-type]
    assert one["nodes"] == ("m1", "m2", "m3") and one["host"] == "10.213.8.1"
    # /etc/hosts lines of one instance are never taken for the other's (each drops only lines ending in its tag)
    assert not str(one["hosts_tag"]).endswith(str(zero["hosts_tag"]))
    # instance 0's wrappers are the plain clients; another's are under /usr too, out of a root filesystem's sight
    assert str(one["wrappers"]).startswith("/usr/")


def test_an_instance_knows_its_own_nodes_only(monkeypatch: pytest.MonkeyPatch) -> None:
    one = load(monkeypatch, "1")
    assert [one.is_our_node(n) for n in ("m1", "m12", "n1", "m", "mx", "hpctr-m1")] == [1, 1, 0, 0, 0, 0]
    zero = load(monkeypatch, "0")
    assert [zero.is_our_node(n) for n in ("n1", "n12", "m1", "br0")] == [1, 1, 0, 0]


@pytest.mark.parametrize("raw", ["x", "-1", "10", "1.5"])
def test_an_instance_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    with pytest.raises(SystemExit, match="choose an instance from 0 to 9"):
        load(monkeypatch, raw)


def test_the_test_account_is_left_to_the_cluster_still_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The first cluster down while the other is up leaves it the account, its home and the opened folders."""
    one = load(monkeypatch, "1")
    other = one.Paths(tmp_path / "zero")
    other.root.mkdir()
    one.save_record(other, {"up": True, "test_user_root": "/cache/24.11/root", "opened_dirs": {}})
    ran: list[list[str]] = []
    monkeypatch.setattr(one, "run", lambda argv, **kw: ran.append(argv) or type("P", (), {"returncode": 1})())
    ours = {"test_user": "hpctrain-user", "test_user_root": "", "state_dir": str(tmp_path / "one")}
    ours["opened_dirs"] = {"/root": 0o700}
    one.hand_over_test_user(ours, (other, one.load_record(other)))
    left = one.load_record(other)
    assert left["test_user"] == "hpctrain-user" and left["opened_dirs"] == {"/root": 0o700}
    assert left["test_user_homes"] == [str(tmp_path / "one" / "home")]
    assert not any("userdel" in argv for argv in ran)  # the host's account stays for the cluster still up
