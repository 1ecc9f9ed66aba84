"""contract/step_folders.py: one folder life for both checkpoint layouts, and checkpoint_listing's listing of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.contract.checkpoint_listing import (
    DCP_LAYOUT,
    TRAINER_LAYOUT,
    checkpoint_meta,
    complete_checkpoints,
    latest_checkpoint_step,
)
from hpctrain.contract.rundir import META_FILE, checkpoints_dir
from hpctrain.contract.step_folders import MAX_EXAMINED, StepFolders
from hpctrain.errors import CheckpointError


def dcp_step(folders: StepFolders, step: int, ranks: int = 2) -> Path:
    """A DCP-shaped folder: one data file per rank and .metadata, committed with their sizes."""
    tmp = folders.begin(step)
    files = {}
    for rank in range(ranks):
        name = f"__{rank}_0.distcp"
        (tmp / name).write_bytes(b"d" * (10 + rank))
        files[name] = {"size": 10 + rank}
    (tmp / ".metadata").write_bytes(b"m" * 7)
    files[".metadata"] = {"size": 7}
    return folders.commit(tmp, step, files=files, info={"world_size": ranks})


def test_commit_writes_meta_last_and_renames_into_place(tmp_path: Path) -> None:
    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=2)
    final = dcp_step(folders, 4)
    assert final.name == "step-00000004" and not list(final.parent.glob(".tmp-*"))
    meta = json.loads((final / META_FILE).read_text())
    assert (meta["layout"], meta["global_step"], meta["world_size"]) == ("dcp", 4, 2)
    assert meta["files"]["__1_0.distcp"] == {"size": 11}
    assert checkpoint_meta(final) == meta and checkpoint_meta(final, DCP_LAYOUT) == meta
    assert checkpoint_meta(final, TRAINER_LAYOUT) is None
    assert latest_checkpoint_step(tmp_path) == 4


def test_a_torn_folder_is_ignored_and_the_previous_one_listed(tmp_path: Path) -> None:
    folders = StepFolders(tmp_path, layout=DCP_LAYOUT, keep_last=5)
    good = dcp_step(folders, 2)
    torn = dcp_step(folders, 4)
    (torn / "__1_0.distcp").write_bytes(b"short")  # one rank's file cut short
    missing = dcp_step(folders, 6)
    (missing / "__0_0.distcp").unlink()  # one rank's file gone
    no_meta = dcp_step(folders, 8)
    (no_meta / META_FILE).unlink()  # the writer died before the meta
    assert folders.checkpoints() == [good]


def test_meta_that_names_a_path_instead_of_a_file_is_not_complete(tmp_path: Path) -> None:
    folders = StepFolders(tmp_path, layout=DCP_LAYOUT, keep_last=2)
    final = dcp_step(folders, 1)
    meta = json.loads((final / META_FILE).read_text())
    (tmp_path / "outside").write_bytes(b"x" * 3)
    for name in ("../outside", "/etc/hostname", "meta.json"):
        (final / META_FILE).write_text(json.dumps({**meta, "files": {name: {"size": 3}}}))
        assert checkpoint_meta(final) is None, name
    (final / META_FILE).write_text(json.dumps({**meta, "files": {}}))
    assert checkpoint_meta(final) is None


def test_layouts_share_a_directory_without_pruning_each_other(tmp_path: Path) -> None:
    trainer = StepFolders(tmp_path, layout=TRAINER_LAYOUT, keep_last=1)
    tmp = trainer.begin(1)
    (tmp / "state.pt").write_bytes(b"s")
    trainer.commit(tmp, 1, files={"state.pt": {"size": 1}}, info={})
    task = StepFolders(tmp_path, layout=DCP_LAYOUT, keep_last=1)
    for step in (2, 3):
        dcp_step(task, step)
        task.prune()
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-00000001", "step-00000003"]
    assert [p.name for p in trainer.checkpoints()] == ["step-00000001"]


def test_prune_keeps_the_newest_and_retries_old_folders(tmp_path: Path) -> None:
    folders = StepFolders(tmp_path, layout=DCP_LAYOUT, keep_last=2)
    stuck = tmp_path / ".old-step-00000000-0badc0de"
    stuck.mkdir(parents=True)
    (stuck / ".nfs0001").write_bytes(b"closed since")
    for step in (1, 2, 3):
        dcp_step(folders, step)
        folders.prune()
    assert [p.name for p in folders.checkpoints()] == ["step-00000002", "step-00000003"]
    assert not stuck.exists()


def test_the_first_begin_sweeps_crashed_writers_leftovers_and_a_resave_replaces(tmp_path: Path) -> None:
    (tmp_path / ".tmp-step-00000005-dead").mkdir(parents=True)
    folders = StepFolders(tmp_path, layout=DCP_LAYOUT, keep_last=3)
    dcp_step(folders, 5)
    assert not (tmp_path / ".tmp-step-00000005-dead").exists()
    again = dcp_step(folders, 5, ranks=3)
    assert json.loads((again / META_FILE).read_text())["world_size"] == 3
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000005"]


def test_keep_last_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="keep_last must be at least 1"):
        StepFolders(tmp_path, layout=DCP_LAYOUT, keep_last=0)


@pytest.mark.parametrize(
    "name",
    [
        "step-" + "9" * 21,
        "step-\u0661\u0662",
        "step-00000007\n",
        "step-+7",
        "step-0x7",
        "step-",
        "step-7",
        "step-000000007",
    ],
)
def test_a_folder_name_that_is_no_plain_step_is_never_listed(tmp_path: Path, name: str) -> None:
    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=5)
    good = dcp_step(folders, 7)
    planted = good.parent / name
    planted.mkdir()
    for child in good.iterdir():
        (planted / child.name).write_bytes(child.read_bytes())
    assert complete_checkpoints(folders.directory) == [good]
    assert list(folders.newest_first()) == [good] and latest_checkpoint_step(tmp_path) == 7


def test_a_folders_step_is_its_meta_json_s_which_its_name_must_match(tmp_path: Path) -> None:
    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=5)
    good = dcp_step(folders, 3)
    renamed = dcp_step(folders, 4).rename(good.parent / "step-00090000")  # the name says 90000, meta.json 4
    huge = dcp_step(folders, 5)
    meta = json.loads((huge / META_FILE).read_text())
    meta["global_step"] = 10**21  # a step no int64 holds, in a folder whose name agrees with nothing
    (huge / META_FILE).write_text(json.dumps(meta))
    assert checkpoint_meta(renamed) is None and checkpoint_meta(huge) is None
    assert complete_checkpoints(folders.directory) == [good] and latest_checkpoint_step(tmp_path) == 3


def test_a_load_examines_a_bounded_number_of_folders_and_then_says_so(tmp_path: Path) -> None:
    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=50)
    dcp_step(folders, 1)
    for step in range(2, 2 + MAX_EXAMINED + 3):
        torn = dcp_step(folders, step)
        (torn / ".metadata").write_bytes(b"short")  # no longer the recorded size: incomplete
    with pytest.raises(CheckpointError, match=f"the newest {MAX_EXAMINED} step folders .* the 4 older ones"):
        list(folders.newest_first())
    assert [p.name for p in folders.newest_first(newest=5)] == ["step-00000001"]


@pytest.mark.parametrize("layout", [DCP_LAYOUT, TRAINER_LAYOUT])
def test_a_checkpoints_dir_linked_out_of_the_run_is_refused_by_save_list_and_load(tmp_path: Path, layout: str) -> None:
    scratch = tmp_path / "scratch" / "ckpts"
    scratch.mkdir(parents=True)
    run = tmp_path / "run"
    run.mkdir()
    checkpoints_dir(run).symlink_to(scratch)
    folders = StepFolders(checkpoints_dir(run), layout=layout, keep_last=2)
    for call in (lambda: folders.begin(1), folders.checkpoints, lambda: list(folders.newest_first())):
        with pytest.raises(CheckpointError, match="outside .* never be listed, loaded or pruned") as raised:
            call()
        assert repr(str(scratch)) in (raised.value.hint or "")
    assert list(scratch.iterdir()) == []  # nothing written where it would never be found
    inside = run / "elsewhere"
    inside.mkdir()
    checkpoints_dir(run).unlink()
    checkpoints_dir(run).symlink_to(inside)  # a link that stays inside the run is followed by all of them
    written = dcp_step(StepFolders(checkpoints_dir(run), layout=DCP_LAYOUT, keep_last=2), 2)
    assert complete_checkpoints(checkpoints_dir(run)) == [written]


def test_the_latest_checkpoint_is_found_newest_first_without_examining_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.contract import checkpoint_listing

    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=50)
    for step in (3, 10, 200):
        dcp_step(folders, step)
    examined: list[str] = []
    real = checkpoint_listing.checkpoint_meta
    monkeypatch.setattr(
        checkpoint_listing, "checkpoint_meta", lambda path, *a: examined.append(path.name) or real(path, *a)
    )
    assert latest_checkpoint_step(tmp_path) == 200 and examined == ["step-00000200"]


def test_folders_of_later_steps_never_push_the_writers_own_out(tmp_path: Path) -> None:
    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=2)
    planted = [dcp_step(folders, step) for step in (99_999_998, 99_999_999)]  # complete, from "the future"
    for step in (1, 2, 3):
        dcp_step(folders, step)
        folders.prune(step)
    names = [p.name for p in complete_checkpoints(folders.directory)]
    assert names == ["step-00000002", "step-00000003", *(p.name for p in planted)]


def test_a_prune_examines_a_bounded_number_of_folders_and_thins_a_crowded_directory_over_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpctrain.contract import checkpoint_listing

    folders = StepFolders(checkpoints_dir(tmp_path), layout=DCP_LAYOUT, keep_last=2)
    future = dcp_step(folders, 99_999_999)
    for step in range(1, 31):
        dcp_step(folders, step)
    examined: list[str] = []
    real = checkpoint_listing.checkpoint_meta
    monkeypatch.setattr(
        checkpoint_listing, "checkpoint_meta", lambda path, *a: examined.append(path.name) or real(path, *a)
    )
    folders.prune(30)
    assert len(examined) <= 2 + MAX_EXAMINED + 1 and future.name not in examined  # (+1: best.json's check)
    assert len(complete_checkpoints(folders.directory)) == 1 + 2 + (30 - 2 - MAX_EXAMINED)
    folders.prune(30)
    assert [p.name for p in complete_checkpoints(folders.directory)] == ["step-00000029", "step-00000030", future.name]
