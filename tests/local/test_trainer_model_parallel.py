"""strategy: model_parallel on a machine with two or more GPUs: without micro-batches it computes what
single computes, so one epoch's losses agree; skipped with fewer GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import context, job_spec

from hpctrain.trainer.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]


def test_model_parallel_loss_matches_single(data_root: Path, tmp_path: Path) -> None:
    trainer = {"epochs": 1, "max_steps_per_epoch": 3, "deterministic": True}
    single = Trainer(context(tmp_path / "single", job_spec(data_root, trainer=trainer), device="cuda:0")).fit()
    spec = job_spec(data_root, trainer={**trainer, "strategy": "model_parallel"})
    split = Trainer(context(tmp_path / "mp", spec, device="cuda:0")).fit()
    assert split["status"] == "completed" and split["strategy"] == "model_parallel"
    assert split["train_loss"] == pytest.approx(single["train_loss"], rel=1e-4)
    assert split["val_loss"] == pytest.approx(single["val_loss"], rel=1e-3)
