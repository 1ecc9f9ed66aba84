"""strategy: pipeline on gloo ranks: one step's loss and gradients are the unsplit model's, it learns,
resumes from its checkpoints, and a checkpoint holds the whole model under torchvision's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from pipeline_harness import run_ranks
from trainer_harness import job_spec, train

from hpctrain.contract.rundir import checkpoints_dir
from hpctrain.trainer.checkpoint import CheckpointManager

pytestmark = pytest.mark.local_dist

RESNET18_PARAMS = 62  # parameter tensors


def check_step(ranks: list[dict[str, Any]], stages: int) -> None:
    """Every parameter's gradient is on exactly one stage per pipeline and equals the unsplit model's."""
    for replica in range(len(ranks) // stages):
        pipeline = ranks[replica * stages : (replica + 1) * stages]
        names = [name for rank in pipeline for name in rank["compared"]]
        assert len(names) == len(set(names)) == RESNET18_PARAMS
    for rank in ranks:
        assert rank["worst_relative_diff"] < 1e-5, rank
    torch.testing.assert_close(ranks[0]["loss"], ranks[0]["reference_loss"], rtol=1e-5, atol=1e-6)
    assert all(rank["loss"] is None for rank in ranks[1:stages])  # only the first stage hears the loss


def test_two_stage_step_matches_the_unsplit_model(tmp_path: Path) -> None:
    ranks = run_ranks("grads", 2, tmp_path, stages=2, schedule="1f1b", microbatches=2)
    check_step(ranks, stages=2)
    assert ranks[0]["split"] == ranks[1]["split"] and ranks[0]["split"][1].startswith("layer4.1..fc")


def test_two_stages_by_two_replicas_match_the_unsplit_model(tmp_path: Path) -> None:
    """Replicas train on different batches; their stages' gradients are averaged like DDP's."""
    ranks = run_ranks("grads", 4, tmp_path, stages=2, schedule="gpipe", microbatches=4)
    check_step(ranks, stages=2)


def test_pipeline_learns_resumes_and_its_checkpoint_loads_into_single(data_root: Path, tmp_path: Path) -> None:
    trainer = {
        "epochs": 3,
        "max_steps_per_epoch": None,
        "lr": 0.002,
        "lr_scaling": "none",
        "schedule": "constant",
        "pipeline": {"stages": 2, "microbatches": 2},
    }
    run_dir = tmp_path / "run"
    ranks = run_ranks("train", 2, tmp_path / "out", data_root=str(data_root), run_dir=str(run_dir), trainer=trainer)
    first, resumed = ranks[0]["first"], ranks[0]["resumed"]
    assert first["status"] == resumed["status"] == "completed"
    assert first["strategy"] == "pipeline" and first["global_batch_size"] == 8
    assert first["global_step"] == 24 and resumed["global_step"] == 32 and resumed["restarts"] == 1
    assert resumed["best_val_top1"] >= 50.0  # 4 classes: chance is 25 %
    assert {rank["resumed"]["weights_sha256"] for rank in ranks} == {resumed["weights_sha256"]}

    state = CheckpointManager(checkpoints_dir(run_dir)).load()
    assert state["optimizer"] is None and len(state["pipeline"]) == 2  # one optimizer state per stage
    assert [len(stage["state"]) for stage in state["pipeline"]] == [54, 8]  # momentum of each stage's params

    # The whole model, under torchvision's keys: strategy single evaluates it to the same accuracy.
    torch.set_num_threads(1)
    spec = job_spec(data_root, trainer={"strategy": "single", "evaluate_only": True, "epochs": 4})
    alone = train(run_dir, spec)
    assert alone["weights_sha256"] == resumed["weights_sha256"]
    assert alone["val_top1"] == resumed["val_top1"] and alone["val_loss"] == pytest.approx(resumed["val_loss"])


def test_pipeline_without_micro_batches_trains_like_single(data_root: Path, tmp_path: Path) -> None:
    """One micro-batch per step: BatchNorm sees the whole batch, so the weights follow single's."""
    trainer = {"epochs": 1, "max_steps_per_epoch": 3, "pipeline": {"stages": 2, "microbatches": 1, "schedule": "gpipe"}}
    run_ranks(
        "train",
        2,
        tmp_path / "out",
        data_root=str(data_root),
        run_dir=str(tmp_path / "pipe"),
        trainer=trainer,
        resume=False,
    )
    torch.set_num_threads(1)
    train(tmp_path / "single", job_spec(data_root, trainer={**trainer, "strategy": "single"}))
    piped = CheckpointManager(checkpoints_dir(tmp_path / "pipe")).load()["model"]
    single = CheckpointManager(checkpoints_dir(tmp_path / "single")).load()["model"]
    assert piped.keys() == single.keys()
    for name, tensor in single.items():
        torch.testing.assert_close(piped[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
