"""trainer/checkpoint.py's search for a checkpoint to resume from: a directory it could never list is refused,
never searched in vain (a run that started over would prune its checkpoints), and a folder's name is checked
against its meta.json before its step is believed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hpctrain.contract.rundir import META_FILE, checkpoints_dir
from hpctrain.errors import CheckpointError
from hpctrain.trainer.checkpoint import CheckpointManager


def state(step: int) -> dict[str, object]:
    return {"model": {"w": torch.full((3,), float(step))}, "progress": {"epoch": 0}}


def test_a_checkpoints_dir_linked_out_of_the_run_is_refused_at_the_first_load_and_save(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (tmp_path / "run").mkdir()
    checkpoints_dir(tmp_path / "run").symlink_to(scratch)
    manager = CheckpointManager(checkpoints_dir(tmp_path / "run"), keep_last=2, async_save=False)
    with pytest.raises(CheckpointError, match="would never be listed, loaded or pruned"):
        manager.load(map_location="meta")
    with pytest.raises(CheckpointError, match="would never be listed, loaded or pruned"):
        manager.save(state(1), step=1, epoch=0)
    assert list(scratch.iterdir()) == []


def test_a_copied_folder_whose_name_says_another_step_is_not_resumed_from(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=False)
    manager.save(state(3), step=3, epoch=0)
    shutil.copytree(tmp_path / "step-00000003", tmp_path / "step-00000900")  # meta.json still says 3
    shutil.copytree(tmp_path / "step-00000003", tmp_path / ("step-" + "9" * 21))
    assert json.loads((tmp_path / "step-00000900" / META_FILE).read_text())["global_step"] == 3
    loaded = manager.load()
    assert loaded is not None and manager.last_loaded == tmp_path / "step-00000003"
    assert manager.checkpoints() == [tmp_path / "step-00000003"]
