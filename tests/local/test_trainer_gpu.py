"""The trainer on one CUDA GPU: fp16 with loss scaling, exact resume, dp, device placement of checkpoints.

Written for a single-GPU machine; skipped without CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import context, job_spec, stop_at

from hpctrain.contract.rundir import checkpoints_dir
from hpctrain.trainer.checkpoint import CheckpointManager
from hpctrain.trainer.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def gpu_train(run_dir: Path, spec, stop_after: int | None = None) -> dict:
    hook = stop_at(stop_after) if stop_after is not None else None
    return Trainer(context(run_dir, spec, device="cuda:0"), on_step=hook).fit()


def test_fp16_with_grad_scaler_trains_and_checkpoints_the_scaler(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"precision": "fp16", "channels_last": True, "epochs": 2})
    result = gpu_train(tmp_path, spec)
    assert result["status"] == "completed" and result["precision"] == "fp16" and result["device"] == "cuda:0"
    assert result["global_step"] == 6 and result["train_loss"] > 0
    state = CheckpointManager(checkpoints_dir(tmp_path)).load(map_location="cpu")
    assert state["precision"]["precision"] == "fp16" and state["precision"]["scaler"]["scale"] > 0


def test_checkpoint_loads_onto_the_requested_device(data_root: Path, tmp_path: Path) -> None:
    gpu_train(tmp_path, job_spec(data_root))
    manager = CheckpointManager(checkpoints_dir(tmp_path))
    on_gpu = manager.load(map_location=torch.device("cuda", 0))
    assert on_gpu["model"]["fc.weight"].device == torch.device("cuda", 0)
    assert on_gpu["optimizer"]["state"][0]["momentum_buffer"].device == torch.device("cuda", 0)
    on_cpu = manager.load(map_location=torch.device("cpu"))
    assert on_cpu["model"]["fc.weight"].device.type == "cpu"


def test_deterministic_resume_is_exact_on_cuda(data_root: Path, tmp_path: Path) -> None:
    trainer = {"arch": "mobilenet_v3_small", "epochs": 2, "max_steps_per_epoch": 4, "deterministic": True}
    spec = job_spec(data_root, trainer=trainer)
    full = gpu_train(tmp_path / "full", spec)
    stopped = gpu_train(tmp_path / "split", spec, stop_after=3)
    assert stopped["status"] == "stopped"
    resumed = gpu_train(tmp_path / "split", spec)
    assert resumed["weights_sha256"] == full["weights_sha256"] and resumed["val_top1"] == full["val_top1"]


def test_dp_on_one_gpu_trains(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"strategy": "dp", "precision": "bf16"})
    result = gpu_train(tmp_path, spec)
    assert result["status"] == "completed" and result["strategy"] == "dp"
    assert result["global_batch_size"] == 8 * torch.cuda.device_count()


def test_compiled_fp16_run_trains_with_the_fused_step(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"compile": True, "precision": "fp16", "channels_last": True})
    trainer = Trainer(context(tmp_path, spec, device="cuda:0"))
    result = trainer.fit()
    assert result["status"] == "completed" and result["global_step"] == 3
    assert trainer.module._compiled_call_impl is not None and trainer.optimizer.defaults["fused"] is True
    assert 0 <= result["data_wait_fraction"] <= 1
