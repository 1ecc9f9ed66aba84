"""Training on a packed image is training on the folder: same weights, same exact resume, no file of the tree.

The original tree is moved away after packing, so any open (or listing) of it
would fail; the index is read from the image, so nothing scans the mount
either (``scan_split`` raises if called).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import job_spec, train

from hpctrain.dataset import index as index_module
from hpctrain.dataset import mount_release
from hpctrain.dataset.pack import pack
from hpctrain.jobspec.models import JobSpec
from tests.squashfs_tools import require_mount

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def packed(data_root: Path, tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(the image, a copy of the tree, the node's stage dir); the copy is moved away once packed."""
    require_mount()
    tree = tmp_path / "tree"
    shutil.copytree(data_root, tree)
    image = tmp_path / "data.sqsh"
    pack(tree, image, log=lambda line: None)
    stage = tmp_path / "node"
    stage.mkdir()
    yield image, tree, stage
    for point in stage.glob("hpctrain-*/job-*/mnt-*"):  # this process's mounts: its watchers wait for pytest
        if point.is_dir() or mount_release.is_mounted(point):
            assert mount_release.release(point, None)
    assert not [line for line in Path("/proc/mounts").read_text().splitlines() if str(stage) in line]


def _on_image(spec: JobSpec, image: Path, stage_dir: Path, **data: object) -> JobSpec:
    return spec.model_copy(
        update={"data": spec.data.model_copy(update={"root": str(image), "stage_dir": str(stage_dir), **data})}
    )


def _no_scan(*args: object, **kwargs: object) -> None:
    raise AssertionError("the packed run listed a tree instead of reading the index in the image")


@pytest.mark.parametrize("stage", ["none", "node"])
def test_packed_run_matches_the_folder_and_opens_nothing_of_the_tree(
    stage: str, data_root: Path, packed: tuple[Path, Path, Path], tmp_path: Path, monkeypatch
) -> None:
    image, tree, stage_dir = packed
    trainer = {"epochs": 2, "max_steps_per_epoch": 3, "deterministic": True}
    spec = job_spec(tree, trainer=trainer)
    on_folder = train(tmp_path / "folder", spec)
    assert on_folder["status"] == "completed"

    tree.rename(tmp_path / "moved-away")  # any open of the tree's files now fails
    monkeypatch.setattr(index_module, "scan_split", _no_scan)
    on_image = train(tmp_path / "image", _on_image(spec, image, stage_dir, stage=stage))
    assert on_image["status"] == "completed"
    assert on_image["weights_sha256"] == on_folder["weights_sha256"]
    assert on_image["val_top1"] == on_folder["val_top1"]
    assert on_image.get("skipped_samples", 0) == 0
    if stage == "node":
        assert [p.name for p in stage_dir.glob("hpctrain-*/job-*/image-data.sqsh-*")], (
            "the image was not copied to the node"
        )


def test_exact_resume_on_the_image(packed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    image, tree, stage_dir = packed
    trainer = {"arch": "mobilenet_v3_small", "epochs": 2, "max_steps_per_epoch": 4, "deterministic": True}
    spec = job_spec(tree, trainer=trainer, checkpoint={"every_steps": 3})
    full = train(tmp_path / "full", spec)  # on the folder
    tree.rename(tmp_path / "moved-away")
    on_image = _on_image(spec, image, stage_dir)
    first = train(tmp_path / "split", on_image, stop_after=2)
    assert first["status"] == "stopped" and first["global_step"] == 2
    last = train(tmp_path / "split", on_image)
    assert last["status"] == "completed" and last["global_step"] == 8 and last["restarts"] == 1
    assert last["weights_sha256"] == full["weights_sha256"]
