"""Node-local staging: one copy per node, the others wait, resume, skip, refuse a too-small disk."""

from __future__ import annotations

import os
import shutil
import threading
from collections import namedtuple
from pathlib import Path

import pytest

from hpctrain.dataset.generate import make_dataset
from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Data
from hpctrain.trainer.data import build_datasets
from hpctrain.trainer.data.index import scan_split
from hpctrain.trainer.data.staging import DONE, resolve_stage_dir, stage_dataset


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "ds"
    make_dataset(out, classes=3, per_class=8, val_per_class=5, image_size=40)
    return out


def _indices(root: Path) -> list:
    return [("train", scan_split(root / "train")), ("val", scan_split(root / "val"))]


def test_stage_dir_names_the_node_and_expands_variables() -> None:
    env = {"SLURMD_NODENAME": "n7", "SCRATCH": "/local", "TMPDIR": "/tmpx"}
    assert resolve_stage_dir("$SCRATCH/stage-{node}", env) == Path("/local/stage-n7")
    exists = {"/tmpx", "/job"}.__contains__
    assert resolve_stage_dir(None, env, exists) == Path("/tmpx")
    assert resolve_stage_dir(None, {**env, "SLURM_TMPDIR": "/job"}, exists) == Path("/job")
    # a $SLURM_TMPDIR leaked from a job that has ended names a folder that is gone: passed over, never created
    assert resolve_stage_dir(None, {**env, "SLURM_TMPDIR": "/gone"}, exists) == Path("/tmpx")
    assert resolve_stage_dir(None, {"SLURM_TMPDIR": "/gone"}, exists) == Path("/tmp")


def test_leader_copies_followers_wait_and_a_requeue_skips(root: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    waited: list[Path] = []
    follower = threading.Thread(
        target=lambda: waited.append(stage_dataset(root, _indices(root), tmp_path, is_node_leader=False))
    )
    follower.start()
    dest = stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, readers=4, log=lines.append)
    follower.join(10)
    assert waited == [dest] and (dest / DONE).exists()
    assert sorted(p.relative_to(dest) for p in dest.rglob("*.jpg")) == sorted(
        p.relative_to(root) for p in root.rglob("*.jpg") if p.parts[-3] in ("train", "val")
    )
    assert any("MB/s" in line for line in lines)
    lines.clear()
    stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, log=lines.append)
    assert lines and "staged already" in lines[0]


def test_a_half_done_copy_resumes(root: Path, tmp_path: Path) -> None:
    dest = stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, log=lambda _: None)
    (dest / DONE).unlink()
    victim = next(dest.rglob("*.jpg"))
    victim.unlink()
    lines: list[str] = []
    stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, log=lines.append)
    assert victim.exists() and "1 to copy" in lines[0]


def test_too_small_a_disk_is_refused_on_every_task(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100, 90, 10))
    with pytest.raises(TrainingConfigError, match="data.stage: .* GiB free") as info:
        stage_dataset(root, _indices(root), tmp_path, is_node_leader=True)
    assert "data.stage_dir" in info.value.hint
    with pytest.raises(TrainingConfigError, match="GiB free"):
        stage_dataset(root, _indices(root), tmp_path, is_node_leader=False, timeout_s=5)


def test_datasets_read_the_staged_copy(root: Path, tmp_path: Path) -> None:
    (tmp_path / resolve_stage_dir("{node}", os.environ).name).mkdir()
    spec = Data(
        root=str(root), image_size=32, val_resize=36, workers=0, stage="node", stage_dir=str(tmp_path / "{node}")
    )
    train, val = build_datasets(spec)
    assert train.index.root.startswith(str(tmp_path)) and val.index.root.startswith(str(tmp_path))
    assert train[0][0].shape == (3, 32, 32) and len(val) == 15


@pytest.mark.timeout(60)
def test_fifos_devices_and_broken_links_are_not_staged(root: Path, tmp_path: Path) -> None:
    import os

    tree = tmp_path / "tree"
    shutil.copytree(root, tree)
    folder = tree / "train" / "class_00"
    os.mkfifo(folder / "fifo0.jpg")
    assert "class_00/fifo0.jpg" not in dict(scan_split(tree / "train").samples)  # the scan lists no FIFO
    indices = _indices(tree)
    first, second, third = sorted(folder.glob("class_00_*.jpg"))[:3]  # listed; then swapped after the scan:
    first.unlink()
    os.mkfifo(first)  # copying it would wait for a writer forever
    second.unlink()
    second.symlink_to("/dev/zero")  # copying it would fill the disk
    third.unlink()
    third.symlink_to(tmp_path / "nowhere.jpg")
    lines: list[str] = []
    (tmp_path / "stage").mkdir()
    dest = stage_dataset(tree, indices, tmp_path / "stage", is_node_leader=True, log=lines.append)
    assert (dest / DONE).exists() and not (dest / "train" / first.relative_to(tree / "train")).exists()
    assert any("not staging 3 entries" in line for line in lines)
