"""data.decode gpu/dali on a CUDA device: the trainer trains and resumes exactly with it, and
the device's decode matches the CPU decode of the same boxes. Skipped without CUDA (DALI
tests also without DALI); tests/unit/test_trainer_data_device_decode.py covers the same code on a CPU device.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from trainer_harness import context, job_spec, stop_at

from hpctrain.jobspec.models import JobSpec
from hpctrain.trainer.data import build_datasets, encoded_datasets
from hpctrain.trainer.data.device_decode import resolve_decoder
from hpctrain.trainer.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
DECODERS = ["gpu", pytest.param("dali", marks=pytest.mark.skipif(not HAS_DALI, reason="needs NVIDIA DALI"))]
CUDA = torch.device("cuda", 0)


def _with_decode(spec: JobSpec, decode: str) -> JobSpec:
    return spec.model_copy(update={"data": spec.data.model_copy(update={"decode": decode})})


def _train(run_dir: Path, spec: JobSpec, stop_after: int | None = None) -> dict:
    hook = stop_at(stop_after) if stop_after is not None else None
    return Trainer(context(run_dir, spec, device="cuda:0"), on_step=hook).fit()


@pytest.mark.parametrize("decode", DECODERS)
def test_device_decode_matches_the_cpu_decode_of_the_same_boxes(data_root: Path, decode: str) -> None:
    spec = _with_decode(job_spec(data_root), decode)
    train, val = build_datasets(spec.data, seed=3)
    encoded_train, encoded_val, collate, val_collate = encoded_datasets(train, val, spec.data, decode)
    for dataset, make_batch in ((encoded_train, collate), (encoded_val, val_collate)):
        batch, _ = make_batch([dataset[i] for i in range(8)])
        on_gpu = batch.decode(CUDA).cpu().float()
        batch.backend = "gpu"
        on_cpu = batch.decode(torch.device("cpu")).float()
        assert (on_gpu - on_cpu).abs().mean() < 3.0  # of 255: nvJPEG vs libjpeg IDCT, resampling kernels


def test_auto_picks_a_device_decoder_on_cuda() -> None:
    assert resolve_decoder("auto", CUDA) == ("dali" if HAS_DALI else "gpu")
    assert resolve_decoder("gpu", CUDA) == "gpu"


@pytest.mark.parametrize("decode", DECODERS)
def test_trainer_with_device_decode_trains(data_root: Path, tmp_path: Path, decode: str) -> None:
    spec = _with_decode(job_spec(data_root, trainer={"precision": "fp16", "channels_last": True, "epochs": 2}), decode)
    result = _train(tmp_path, spec)
    assert result["status"] == "completed" and result["global_step"] == 6 and result["train_loss"] > 0


def test_deterministic_resume_is_exact_with_gpu_decode(data_root: Path, tmp_path: Path) -> None:
    trainer = {"arch": "mobilenet_v3_small", "epochs": 2, "max_steps_per_epoch": 4, "deterministic": True}
    spec = _with_decode(job_spec(data_root, trainer=trainer), "gpu")
    full = _train(tmp_path / "full", spec)
    stopped = _train(tmp_path / "split", spec, stop_after=3)
    assert stopped["status"] == "stopped"
    resumed = _train(tmp_path / "split", spec)
    assert resumed["weights_sha256"] == full["weights_sha256"] and resumed["val_top1"] == full["val_top1"]
