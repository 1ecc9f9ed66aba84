"""A job's folder on a node's shared disk (``hpctrain.dataset.node_folder``): this user's alone, removed after the run.

The hostile cases are real: folders and copies planted by another user (a real
other uid, by chown: the tests run as root on the test machines, and skip elsewhere),
a link planted where the user's folder goes, a stage dir that does not exist.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from data_helpers import data_spec

from hpctrain.dataset import node_folder
from hpctrain.dataset.generate import make_dataset
from hpctrain.errors import TrainingConfigError
from hpctrain.trainer.data import build_datasets
from hpctrain.trainer.data.index import scan_split
from hpctrain.trainer.data.staging import stage_dataset

OTHER_UID = 54321
ENV = {"SLURM_JOB_ID": "4711", "SLURM_RESTART_COUNT": "0"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / "ds"
    make_dataset(out, classes=2, per_class=4, val_per_class=2, image_size=24)
    return out


def _indices(root: Path) -> list:
    return [("train", scan_split(root / "train")), ("val", scan_split(root / "val"))]


def _as_other_user(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("planting a folder as another user needs root (chown)")
    for inner in [path, *path.rglob("*")]:
        os.chown(inner, OTHER_UID, OTHER_UID, follow_symlinks=False)


def test_the_users_folder_is_made_private_and_exclusive(tmp_path: Path) -> None:
    folder, attempt = node_folder.job_folder(tmp_path, ENV)
    mine = tmp_path / f"hpctrain-{os.geteuid()}"
    assert folder == mine / "job-4711" and attempt == "0"
    assert (mine.stat().st_mode & 0o777) == 0o700 and mine.stat().st_uid == os.geteuid()
    assert node_folder.job_folder(tmp_path, {**ENV, "SLURM_RESTART_COUNT": "1"}) == (folder, "1")  # a requeue


@pytest.mark.parametrize("planted", ["other-user", "link", "group-writable", "file"])
def test_a_planted_users_folder_is_refused_with_its_owner_and_the_fix(planted: str, tmp_path: Path) -> None:
    mine = tmp_path / f"hpctrain-{os.geteuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "link":
        mine.symlink_to(elsewhere)
    elif planted == "file":
        mine.write_text("x")
    else:
        mine.mkdir(mode=0o700)
        if planted == "group-writable":
            mine.chmod(0o770)
        else:
            _as_other_user(mine)
    with pytest.raises(node_folder.NodeFolderError) as caught:
        node_folder.job_folder(tmp_path, ENV)
    needle = {"other-user": f"belongs to user {OTHER_UID}", "link": "not a folder", "file": "not a folder"}
    assert needle.get(planted, "can be written by others") in caught.value.message
    assert "data.stage_dir" in caught.value.hint
    assert not list(elsewhere.iterdir())  # nothing written through the link


def test_a_planted_stage_copy_is_never_trained_on(root: Path, tmp_path: Path) -> None:
    """Round 4: another user's copy under the computable name was reused whoever wrote it."""
    stage = tmp_path / "stage"
    stage.mkdir()
    forged = tmp_path / "forged"
    shutil.copytree(root, forged)
    planted = next(iter(sorted((root / "train" / "class_00").iterdir()))).read_bytes()
    for image in forged.rglob("*.jpg"):
        image.write_bytes(planted)  # every image the same: a poisoned copy
    for name in ("hpctrain-0123456789abcdef", f"hpctrain-{os.geteuid()}"):  # the old name, and the new one
        shutil.copytree(forged, stage / name)
        (stage / name / "STAGED").write_text("{}")
        _as_other_user(stage / name)
    with pytest.raises(TrainingConfigError, match=f"belongs to user {OTHER_UID}"):
        stage_dataset(root, _indices(root), stage, is_node_leader=True, log=lambda line: None, environ=ENV)
    shutil.rmtree(stage / f"hpctrain-{os.geteuid()}")  # the user removes it, as the hint says
    dest = stage_dataset(root, _indices(root), stage, is_node_leader=True, log=lambda line: None, environ=ENV)
    assert dest.is_relative_to(stage / f"hpctrain-{os.geteuid()}")
    for rel in (p.relative_to(root) for p in root.rglob("*.jpg")):
        assert (dest / rel).read_bytes() == (root / rel).read_bytes()


def test_a_missing_stage_dir_is_an_error_and_never_created(root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "slurm-job-that-ended" / "tmp"
    with pytest.raises(TrainingConfigError, match="does not exist") as caught:
        stage_dataset(root, _indices(root), missing, is_node_leader=True, environ=ENV)
    assert "never created" in (caught.value.hint or "")
    assert not missing.parent.exists()
    with pytest.raises(TrainingConfigError, match="does not exist"):
        build_datasets(data_spec(root, stage="node", stage_dir=str(missing)))
    assert not missing.parent.exists()


def test_the_copy_goes_when_the_run_ends_and_stays_for_a_requeue(root: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    dest = stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, log=lines.append, environ=ENV)
    node_folder.leave(keep=True, log=lines.append)  # stopped for a requeue, or failed: the next attempt may use it
    assert (dest / "STAGED").exists()
    again = stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, log=lines.append, environ=ENV)
    assert again == dest and "staged already" in lines[-1]
    node_folder.leave(keep=False, log=lines.append)  # the run ended: the node's last task removes it
    assert not dest.parent.exists() and "removed" in lines[-1] and "last task" not in lines[-1]


def test_another_task_still_reading_keeps_the_copy(root: Path, tmp_path: Path) -> None:
    import subprocess

    dest = stage_dataset(root, _indices(root), tmp_path, is_node_leader=True, log=lambda line: None, environ=ENV)
    other = subprocess.Popen(["sleep", "60"])
    try:
        node_folder.join(dest.parent, other.pid)  # the node's other task of the job
        node_folder.leave(keep=False, log=lambda line: None)
        assert (dest / "STAGED").exists()
    finally:
        other.kill()
        other.wait()


def test_stale_job_folders_of_the_user_are_swept_live_ones_kept(tmp_path: Path) -> None:
    import subprocess

    mine = node_folder.user_folder(tmp_path)
    stale, live, young = (mine / f"job-{n}" for n in ("1", "2", "3"))
    for folder in (stale, live, young):
        (folder / "users").mkdir(parents=True)
        (folder / "copy").mkdir()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        node_folder.join(live, sleeper.pid)
        node_folder._JOINED.clear()
        old = time.time() - 2 * node_folder.SWEEP_AFTER_S
        for folder in (stale, live):
            os.utime(folder, (old, old))
        folder, _ = node_folder.job_folder(tmp_path, ENV, sweep=True)
        assert not stale.exists() and live.exists() and young.exists() and folder.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_packed_runs_mount_folder_is_private_and_gone_after_the_run(root: Path, tmp_path: Path) -> None:
    """Round 4: every packed run left /tmp/hpctrain-image-<job>/ behind, under a name made not exclusively."""
    from hpctrain.dataset import mount, mount_release
    from hpctrain.dataset.pack import pack
    from tests.squashfs_tools import require_mount

    require_mount()
    image = tmp_path / "data.sqsh"
    pack(root, image, log=lambda line: None)
    stage = tmp_path / "tmp"
    stage.mkdir()
    point = mount.open_image(image, stage, is_node_leader=True, stage=True, environ=ENV, log=lambda line: None)
    try:
        assert point.parent == stage / f"hpctrain-{os.geteuid()}" / "job-4711" and (point / "train").is_dir()
        assert [p.name for p in stage.iterdir()] == [f"hpctrain-{os.geteuid()}"]
    finally:
        node_folder.leave(keep=False, log=lambda line: None)
    assert not mount_release.is_mounted(point) and not point.parent.exists()
