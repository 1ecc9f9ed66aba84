"""nn.DataParallel: on a CPU-only machine it degenerates to calling the model, with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from trainer_harness import job_spec, make_data, read_jsonl, train

from hpctrain.contract.rundir import metrics_path


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; the GPU path is in test_trainer_gpu")
def test_dp_on_cpu_trains_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.set_num_threads(1)
    spec = job_spec(make_data(tmp_path / "data"), trainer={"strategy": "dp", "max_steps_per_epoch": 2})
    with caplog.at_level(logging.WARNING):
        result = train(tmp_path / "run", spec)
    assert "DataParallel has nothing to spread over" in caplog.text
    assert result["status"] == "completed" and result["strategy"] == "dp" and result["global_step"] == 2
    assert result["global_batch_size"] == 8


def test_dp_and_single_train_the_same_model(tmp_path: Path) -> None:
    """DataParallel over one device (or none) must not change the numerics."""
    torch.set_num_threads(1)
    data_root = make_data(tmp_path / "data")
    common = {"max_steps_per_epoch": 2, "deterministic": True}
    single = train(tmp_path / "single", job_spec(data_root, trainer={**common, "strategy": "single"}))
    dp = train(tmp_path / "dp", job_spec(data_root, trainer={**common, "strategy": "dp"}))
    assert dp["weights_sha256"] == single["weights_sha256"]


def test_parallel_loss_on_cpu_trains_the_same_model_as_plain_dp(tmp_path: Path) -> None:
    """Without several GPUs the parallel loss path is the plain one: same weights, same logged loss."""
    torch.set_num_threads(1)
    data_root = make_data(tmp_path / "data")
    common = {"strategy": "dp", "max_steps_per_epoch": 2, "deterministic": True}
    plain = train(tmp_path / "plain", job_spec(data_root, trainer=common))
    parallel = train(tmp_path / "parallel", job_spec(data_root, trainer={**common, "dp_parallel_loss": True}))
    assert parallel["weights_sha256"] == plain["weights_sha256"]
    losses = [
        [(r["loss"], r["top1"]) for r in read_jsonl(metrics_path(run)) if r["kind"] == "train_step"]
        for run in (tmp_path / "plain", tmp_path / "parallel")
    ]
    assert losses[0] and losses[0] == losses[1]
