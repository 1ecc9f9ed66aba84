"""CheckpointManager: complete or ignored, keep-last-N plus best, safe loading, placement."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from hpctrain.contract.rundir import checkpoints_dir
from hpctrain.errors import CheckpointError
from hpctrain.task.weights import weights_sha256
from hpctrain.trainer.checkpoint import CheckpointManager


def state(value: float) -> dict:
    return {
        "model": {"weight": torch.full((4, 3), value), "steps": torch.tensor(7)},
        "optimizer": {"state": {0: {"momentum_buffer": torch.ones(3)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "progress": {"epoch": 1, "name": "x", "best": None, "pair": (1, 2)},
    }


@pytest.fixture(params=[False, True], ids=["sync", "async"])
def manager(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointManager:
    manager = CheckpointManager(checkpoints_dir(tmp_path), keep_last=2, keep_best=True, async_save=request.param)
    yield manager
    manager.close()


def saved(manager: CheckpointManager, value: float, step: int, metric: float | None = None) -> Path:
    path = manager.save(state(value), step=step, epoch=0, metric=metric)
    manager.wait()
    return path


def test_round_trip_and_layout(manager: CheckpointManager) -> None:
    path = saved(manager, 1.5, step=12)
    assert path.name == "step-00000012" and sorted(p.name for p in path.iterdir()) == ["meta.json", "state.pt"]
    meta = json.loads((path / "meta.json").read_text())
    assert meta["global_step"] == 12 and meta["files"]["state.pt"]["size"] == (path / "state.pt").stat().st_size
    loaded = manager.load()
    assert torch.equal(loaded["model"]["weight"], torch.full((4, 3), 1.5))
    assert loaded["progress"] == {"epoch": 1, "name": "x", "best": None, "pair": (1, 2)}
    assert manager.latest() == path and manager.last_loaded == path


def test_async_snapshot_is_taken_at_save_time(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=3, async_save=True)
    live = state(1.0)
    manager.save(live, step=1, epoch=0)
    live["model"]["weight"].fill_(99.0)  # training goes on while the writer runs
    manager.save(live, step=2, epoch=0)  # reuses the staging buffers once the first write is done
    manager.close()
    assert torch.equal(manager.load(tmp_path / "step-00000001")["model"]["weight"], torch.full((4, 3), 1.0))
    assert torch.equal(manager.load()["model"]["weight"], torch.full((4, 3), 99.0))


def test_leftover_tmp_dir_and_dir_without_meta_are_ignored(manager: CheckpointManager) -> None:
    good = saved(manager, 1.0, step=5)
    directory = manager.directory
    (directory / ".tmp-step-00000009-abcd").mkdir()
    (directory / ".tmp-step-00000009-abcd" / "state.pt").write_bytes(b"half")
    torch.save(state(2.0), directory / "state-elsewhere.pt")
    no_meta = directory / "step-00000008"
    no_meta.mkdir()
    torch.save(state(3.0), no_meta / "state.pt")
    assert manager.latest() == good
    assert manager.load()["model"]["weight"][0, 0].item() == 1.0
    restarted = CheckpointManager(directory, keep_last=2, async_save=manager.async_save)
    saved(restarted, 4.0, step=10)  # the first save of a new attempt sweeps the crashed writer's directory
    assert not (directory / ".tmp-step-00000009-abcd").exists() and no_meta.exists()


def test_a_pruned_checkpoint_whose_removal_failed_is_removed_by_a_later_prune(manager: CheckpointManager) -> None:
    """On FUSE/NFS a pruned folder stays while a forked worker still holds its state.pt open."""
    saved(manager, 1.0, step=1)
    stuck = manager.directory / ".old-step-00000000-0badc0de"
    stuck.mkdir()
    (stuck / ".fuse_hidden0000001").write_bytes(b"closed since")
    saved(manager, 2.0, step=2)
    assert not stuck.exists()
    assert [p.name for p in manager.checkpoints()] == ["step-00000001", "step-00000002"]


def test_truncated_state_is_skipped_with_a_warning(
    manager: CheckpointManager, caplog: pytest.LogCaptureFixture
) -> None:
    saved(manager, 1.0, step=1)
    newest = saved(manager, 2.0, step=2)
    state_file = newest / "state.pt"
    with open(state_file, "r+b") as handle:  # same size, different bytes: only the hash can tell
        handle.seek(state_file.stat().st_size // 2)
        handle.write(b"\x00" * 64)
    with caplog.at_level(logging.WARNING):
        loaded = manager.load()
    assert loaded["model"]["weight"][0, 0].item() == 1.0
    assert "skipping corrupt checkpoint" in caplog.text and newest.name in caplog.text
    os.truncate(state_file, 100)  # a truncated file does not even match its recorded size
    assert manager.latest().name == "step-00000001"
    with pytest.raises(CheckpointError):
        manager.load(newest)  # asked for by name: an error, not a silent fallback


def test_keep_last_n_plus_best(manager: CheckpointManager) -> None:
    for step, metric in [(1, 10.0), (2, 50.0), (3, 20.0), (4, 30.0), (5, 40.0)]:
        saved(manager, float(step), step=step, metric=metric)
    names = [p.name for p in manager.checkpoints()]
    assert names == ["step-00000002", "step-00000004", "step-00000005"]
    assert manager.best().name == "step-00000002"
    best = json.loads((manager.directory / "best.json").read_text())
    assert best["metric"] == 50.0 and best["dir"] == "step-00000002"
    saved(manager, 6.0, step=6, metric=60.0)
    assert [p.name for p in manager.checkpoints()] == ["step-00000005", "step-00000006"]


def test_saving_the_same_step_again_replaces_it(manager: CheckpointManager) -> None:
    saved(manager, 1.0, step=3)
    saved(manager, 2.0, step=3, metric=1.0)
    assert [p.name for p in manager.checkpoints()] == ["step-00000003"]
    assert manager.load()["model"]["weight"][0, 0].item() == 2.0


class Payload:
    def __reduce__(self) -> tuple:
        return (print, ("this must never run",))


def test_arbitrary_pickled_objects_are_refused(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=2, async_save=False)
    with pytest.raises(CheckpointError, match="cannot checkpoint"):
        manager.save({"model": {}, "hook": Payload()}, step=1, epoch=0)
    # A checkpoint written by someone else, complete with a matching meta.json, is still refused.
    saved(manager, 1.0, step=2)
    torch.save({"model": {}, "hook": Payload()}, tmp_path / "step-00000002" / "state.pt")
    _rewrite_meta(tmp_path / "step-00000002")
    with pytest.raises(CheckpointError, match="refusing to load"):
        manager.load()


def test_map_location_places_tensors(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep_last=1, async_save=True)
    saved(manager, 1.0, step=1)
    loaded = manager.load(map_location=torch.device("meta"))
    assert loaded["model"]["weight"].device.type == "meta"
    assert manager.load(map_location="cpu")["optimizer"]["state"][0]["momentum_buffer"].device.type == "cpu"


def test_empty_directory_has_no_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "nothing", keep_last=1)
    assert manager.latest() is None and manager.load() is None


def test_weights_digest_ignores_wrapper_prefixes() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    wrapped = {f"module.{k}": v.clone() for k, v in model.state_dict().items()}
    assert weights_sha256(model.state_dict()) == weights_sha256(wrapped)
    with torch.no_grad():
        model[0].weight[0, 0] += 1e-6
    assert weights_sha256(model.state_dict()) != weights_sha256(wrapped)
    assert weights_sha256({"w": torch.ones(2, dtype=torch.bfloat16)}) != weights_sha256({"w": torch.ones(2)})


def _rewrite_meta(directory: Path) -> None:
    import hashlib

    data = (directory / "state.pt").read_bytes()
    meta = json.loads((directory / "meta.json").read_text())
    meta["files"]["state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (directory / "meta.json").write_text(json.dumps(meta))
