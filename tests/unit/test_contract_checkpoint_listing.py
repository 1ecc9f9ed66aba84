"""hpctrain.contract.checkpoint_listing: a checkpoint is complete or it is not listed."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.contract.checkpoint_listing import best_checkpoint, complete_checkpoints, latest_checkpoint_step
from hpctrain.contract.rundir import checkpoints_dir, step_dir_name, write_json_atomic


def checkpoint(root: Path, step: int, *, size: int = 4, recorded: int | None = None, meta: bool = True) -> Path:
    folder = checkpoints_dir(root) / step_dir_name(step)
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"x" * size)
    if meta:
        files = {"state.pt": {"size": size if recorded is None else recorded, "sha256": "-"}}
        (folder / "meta.json").write_text(json.dumps({"format_version": 1, "global_step": step, "files": files}))
    return folder


def test_only_complete_checkpoints_are_listed(tmp_path: Path) -> None:
    assert complete_checkpoints(checkpoints_dir(tmp_path)) == []
    assert latest_checkpoint_step(tmp_path) is None
    first = checkpoint(tmp_path, 2)
    second = checkpoint(tmp_path, 10)
    checkpoint(tmp_path, 12, meta=False)  # still being written
    checkpoint(tmp_path, 14, recorded=99)  # state.pt truncated
    (checkpoints_dir(tmp_path) / ".tmp-step-00000016-abcd").mkdir()
    assert complete_checkpoints(checkpoints_dir(tmp_path)) == [first, second]
    assert latest_checkpoint_step(tmp_path) == 10


def test_best_points_at_a_complete_checkpoint(tmp_path: Path) -> None:
    folder = checkpoint(tmp_path, 3)
    assert best_checkpoint(checkpoints_dir(tmp_path)) is None
    write_json_atomic(checkpoints_dir(tmp_path) / "best.json", {"dir": folder.name})
    assert best_checkpoint(checkpoints_dir(tmp_path)) == folder
    write_json_atomic(checkpoints_dir(tmp_path) / "best.json", {"dir": "step-00000099"})
    assert best_checkpoint(checkpoints_dir(tmp_path)) is None
