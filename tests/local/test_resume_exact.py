"""A deterministic run stopped mid-epoch and resumed ends with the same weights as one never stopped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from trainer_harness import job_spec, run_ranks, train

from hpctrain.contract.rundir import checkpoints_dir, summary_path
from hpctrain.trainer.checkpoint import CheckpointManager

pytestmark = pytest.mark.usefixtures("one_thread")


def test_stopped_and_resumed_twice_matches_uninterrupted(data_root: Path, tmp_path: Path) -> None:
    # mobilenet_v3_small has dropout, so the RNG state must come back too, not only weights and data order.
    trainer = {"arch": "mobilenet_v3_small", "epochs": 2, "max_steps_per_epoch": 4, "deterministic": True}
    spec = job_spec(data_root, trainer=trainer, checkpoint={"every_steps": 3})
    full = train(tmp_path / "full", spec)
    assert full["status"] == "completed" and full["global_step"] == 8

    split = tmp_path / "split"
    first = train(split, spec, stop_after=2)  # mid epoch 1
    assert first["status"] == "stopped" and first["stop_reason"] == "timeout"
    assert first["global_step"] == 2 and first["epochs_completed"] == 0
    meta = json.loads((checkpoints_dir(split) / "step-00000002" / "meta.json").read_text())
    assert meta["tag"] == "stop" and meta["global_step"] == 2
    assert json.loads(summary_path(split).read_text())["status"] == "stopped"

    second = train(split, spec, stop_after=6)  # across an epoch boundary, then mid epoch 2
    assert second["status"] == "stopped" and second["global_step"] == 6 and second["epochs_completed"] == 1
    assert second["restarts"] == 1

    last = train(split, spec)
    assert last["status"] == "completed" and last["global_step"] == 8 and last["restarts"] == 2
    assert last["weights_sha256"] == full["weights_sha256"]
    assert last["val_top1"] == full["val_top1"] and last["train_top1"] == full["train_top1"]
    # The optimizer state went through the checkpoints too, not only the weights.
    ours = CheckpointManager(checkpoints_dir(split)).load()
    theirs = CheckpointManager(checkpoints_dir(tmp_path / "full")).load()
    for key, state in theirs["optimizer"]["state"].items():
        assert torch.equal(ours["optimizer"]["state"][key]["momentum_buffer"], state["momentum_buffer"])
    assert ours["scheduler"]["last_epoch"] == theirs["scheduler"]["last_epoch"] == 8


def test_stop_after_last_step_of_epoch_resumes_into_validation(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"epochs": 2, "max_steps_per_epoch": 2, "deterministic": True})
    full = train(tmp_path / "full", spec)
    stopped = train(tmp_path / "split", spec, stop_after=2)  # the epoch's last step: validation not run yet
    assert stopped["status"] == "stopped" and stopped["epochs_completed"] == 0
    resumed = train(tmp_path / "split", spec)
    assert resumed["weights_sha256"] == full["weights_sha256"]
    assert resumed["epochs_completed"] == 2 and resumed["val_top1"] == full["val_top1"]


@pytest.mark.local_dist
def test_two_ranks_stopped_on_one_rank_resume_exactly(data_root: Path, tmp_path: Path) -> None:
    results = run_ranks("resume", 2, tmp_path / "out", data_root=str(data_root), base_dir=str(tmp_path), stop_after=4)
    for rank, result in enumerate(results):
        assert result["stopped"]["status"] == "stopped", rank  # rank 1 asked; both agreed
        assert result["stopped"]["global_step"] == 4
        assert result["resumed"]["status"] == "completed"
        assert result["resumed"]["weights_sha256"] == result["full"]["weights_sha256"]
    assert results[0]["full"]["weights_sha256"] == results[1]["full"]["weights_sha256"]
    assert results[0]["resumed"]["val_top1"] == results[0]["full"]["val_top1"]
    summary = json.loads(summary_path(tmp_path / "split").read_text())
    assert summary["world_size"] == 2 and summary["restarts"] == 1


def test_a_last_batch_of_one_image_neither_crashes_batchnorm_nor_a_resume(tmp_path: Path) -> None:
    """65 images, batch 8, ResNet at 32 px (its last feature map is 1x1): the epoch's last step used to hold
    one image, and BatchNorm refuses one value per channel in training, at every epoch's end and every resume."""
    from hpctrain.dataset.generate import make_dataset

    data = tmp_path / "data"
    make_dataset(data, classes=5, per_class=13, val_per_class=2, image_size=32)  # 65 training images
    spec = job_spec(data, trainer={"epochs": 2, "max_steps_per_epoch": None, "deterministic": True})
    full = train(tmp_path / "full", spec)
    assert full["status"] == "completed" and full["global_step"] == 18  # 9 steps of 8, the last one filled up
    stopped = train(tmp_path / "split", spec, stop_after=8)  # before the epoch's last step
    assert stopped["status"] == "stopped"
    resumed = train(tmp_path / "split", spec)
    assert resumed["status"] == "completed" and resumed["weights_sha256"] == full["weights_sha256"]
