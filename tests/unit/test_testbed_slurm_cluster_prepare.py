"""``tests/cluster/slurm-cluster prepare``: a root filesystem is made once, whole, by one process at a time.

mmdebstrap is replaced by a fake builder (no network, no root): these tests check the cache's lock,
the temporary folder renamed into place, and what `prepare` asks for.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from types import ModuleType

import pytest

from tests.cluster_scripts import load_cluster_script


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    module = load_cluster_script("slurm-cluster")
    monkeypatch.setattr(module, "ROOTFS_CACHE", tmp_path / "cache")
    monkeypatch.setattr(module, "APT_LOCK", tmp_path / "apt.lock")
    monkeypatch.setattr(module, "ensure_mmdebstrap", lambda: None)
    return module


class FakeBuilder:
    """Stands in for mmdebstrap: writes a file into the target after `seconds`, or fails with `why`."""

    def __init__(self, seconds: float = 0.0, why: str = "") -> None:
        self.seconds, self.why = seconds, why
        self.calls: list[Path] = []
        self.started = threading.Event()

    def __call__(self, suite: str, packages: list[str], target: Path) -> str:
        self.calls.append(target)
        self.started.set()
        target.mkdir(parents=True)
        time.sleep(self.seconds)
        (target / "made-from").write_text(f"{suite} {' '.join(packages)}")
        return self.why


def _build(cluster: ModuleType, packages: list[str] | None = None) -> Path:
    return cluster.build_rootfs("24.11", "trixie", packages or ["slurmd"], "the test rootfs", lambda _: None)


def test_a_root_filesystem_is_made_once_then_taken_from_the_cache(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = FakeBuilder()
    monkeypatch.setattr(cluster, "mmdebstrap", builder)
    root = _build(cluster)
    assert root == cluster.ROOTFS_CACHE / "24.11" / "root"
    assert (root / "made-from").read_text() == "trixie slurmd"
    assert not (root.parent / "root.partial").exists()
    assert _build(cluster) == root
    assert len(builder.calls) == 1


def test_a_second_process_waits_for_the_build_in_progress_and_uses_it(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = FakeBuilder(seconds=0.5)
    monkeypatch.setattr(cluster, "mmdebstrap", builder)
    first: list[Path] = []
    thread = threading.Thread(target=lambda: first.append(_build(cluster)))
    thread.start()
    assert builder.started.wait(5)
    seen_at_start = (cluster.ROOTFS_CACHE / "24.11" / "root").exists()
    second = _build(cluster)  # waits on the lock, then finds the first one's
    thread.join(5)
    assert not seen_at_start  # the build in progress lies in root.partial, never at root
    assert first == [second] and (second / "made-from").exists()
    assert len(builder.calls) == 1


def test_a_failed_build_leaves_nothing_behind_and_the_next_try_builds_again(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster, "mmdebstrap", FakeBuilder(why="E: cannot reach deb.debian.org"))
    with pytest.raises(cluster.RootfsUnavailable, match=r"could not make the test rootfs \(Debian trixie\): E: cannot"):
        _build(cluster)
    base = cluster.ROOTFS_CACHE / "24.11"
    assert sorted(p.name for p in base.iterdir()) == ["lock"]
    retry = FakeBuilder()
    monkeypatch.setattr(cluster, "mmdebstrap", retry)
    assert (_build(cluster) / "made-from").exists() and len(retry.calls) == 1


def test_a_cache_made_from_another_package_list_is_made_again(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    builder = FakeBuilder()
    monkeypatch.setattr(cluster, "mmdebstrap", builder)
    _build(cluster, ["slurmd"])
    root = _build(cluster, ["slurmd", "munge"])
    assert (root / "made-from").read_text() == "trixie slurmd munge"
    assert len(builder.calls) == 2


def test_prepare_makes_each_version_and_apptainer_once_and_starts_no_cluster(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []
    monkeypatch.setattr(cluster, "ensure_packages", lambda: asked.append("host packages"))
    monkeypatch.setattr(cluster, "ensure_rootfs", lambda version: asked.append(version))
    monkeypatch.setattr(cluster, "ensure_apptainer", lambda: asked.append("apptainer"))
    monkeypatch.setattr(cluster, "ensure_image_sif", lambda paths: asked.append("image"))
    monkeypatch.setattr(cluster, "up", lambda *a, **k: pytest.fail("prepare started a cluster"))
    cluster.prepare(["24.11", "22.05", "26.05", "24.11"], apptainer=True)
    assert asked == ["host packages", "24.11", "26.05", "apptainer", "image"]  # 22.05 is the host's


def test_prepare_without_a_registry_exits_4_with_the_reason(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "ensure_packages", lambda: None)
    monkeypatch.setattr(cluster, "mmdebstrap", FakeBuilder(why="E: cannot reach deb.debian.org"))
    assert cluster.main(["prepare", "--slurm", "26.05"]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith("slurm-cluster: error: could not make the Slurm 26.05 root filesystem (Debian sid)")
    assert "\n" not in err


def test_prepare_refuses_a_version_that_is_not_offered(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "prepare", lambda *a: pytest.fail("prepared an unknown version"))
    assert cluster.main(["prepare", "--slurm", "24.11", "23.02"]) == 2
    assert "--slurm 23.02 is not offered; choose one of 22.05" in capsys.readouterr().err


def test_the_sif_image_is_packed_once_per_image_root_filesystem_and_copied_out(
    cluster: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sandbox = tmp_path / "cache" / "image" / "root"
    sandbox.mkdir(parents=True)
    (sandbox.parent / "complete").write_text("the image's root filesystem\n")
    monkeypatch.setattr(cluster, "ensure_image_rootfs", lambda: sandbox)
    monkeypatch.setattr(cluster, "start_apptainer", lambda paths, name, binds: 4242)
    monkeypatch.setattr(cluster, "stop_rootfs", lambda *a, **k: [])
    packed: list[str] = []

    def apptainer_build(argv: list[str], **_: object) -> subprocess.CompletedProcess:
        assert argv[-3:-1] == ["--force", argv[-2]] and argv[-1] == str(sandbox)
        Path(argv[-2]).write_bytes(b"SIF %d" % len(packed))
        packed.append(argv[-2])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(cluster, "run", apptainer_build)
    paths = cluster.Paths(tmp_path / "state")
    first, second = tmp_path / "a.sif", tmp_path / "b.sif"
    cluster.build_image(paths, first)
    cluster.build_image(paths, second)
    assert first.read_bytes() == second.read_bytes() == b"SIF 0" and len(packed) == 1
    assert not Path(packed[0]).exists()  # packed beside, then renamed into place
    stamp = sandbox.parent / "complete"
    os.utime(stamp, ns=(stamp.stat().st_atime_ns, stamp.stat().st_mtime_ns + 10**9))  # the rootfs made again
    cluster.build_image(paths, first)
    assert first.read_bytes() == b"SIF 1" and len(packed) == 2
