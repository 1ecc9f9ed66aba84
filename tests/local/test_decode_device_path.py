"""The trainer end to end with the device-decode data path, run here on the CPU device.

``resolve_decoder`` refuses 'gpu' without CUDA (as it should for users); the
tests lift that refusal so the whole path (bytes + boxes from loader workers,
``EncodedBatch.to(device)`` in the training and evaluation loops, the sampler's
resume) runs where no GPU is. tests/local/test_decode_gpu.py repeats it on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_harness import context, job_spec, stop_at

from hpctrain.spec.models import JobSpec
from hpctrain.trainer import data
from hpctrain.trainer.trainer import Trainer


@pytest.fixture(autouse=True)
def device_decode_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data, "resolve_decoder", lambda decode, device: decode)


def _spec(data_root: Path, decode: str, **trainer: object) -> JobSpec:
    spec = job_spec(data_root, trainer={"epochs": 2, **trainer})
    return spec.model_copy(update={"data": spec.data.model_copy(update={"decode": decode, "workers": 2})})


def _train(run_dir: Path, spec: JobSpec, stop_after: int | None = None) -> dict:
    hook = stop_at(stop_after) if stop_after is not None else None
    return Trainer(context(run_dir, spec), on_step=hook).fit()


def test_training_on_device_decoded_batches_matches_cpu_decoding(
    data_root: Path, tmp_path: Path, one_thread: None
) -> None:
    device = _train(tmp_path / "gpu-path", _spec(data_root, "gpu", epochs=1))
    cpu = _train(tmp_path / "cpu-path", _spec(data_root, "cpu", epochs=1))
    assert device["status"] == cpu["status"] == "completed" and device["global_step"] == cpu["global_step"] == 3
    # Same samples, same crops, another decoder (the CPU path decodes DCT-scaled) and resampler: one epoch's
    # losses agree to about 1% (lr 0.1 on 64 images amplifies pixel noise; pixels: tests/unit/test_device_decode.py).
    assert device["train_loss"] == pytest.approx(cpu["train_loss"], rel=0.02)


def test_resume_is_exact_on_the_device_decode_path(data_root: Path, tmp_path: Path, one_thread: None) -> None:
    spec = _spec(data_root, "gpu", max_steps_per_epoch=4, deterministic=True)
    full = _train(tmp_path / "full", spec)
    stopped = _train(tmp_path / "split", spec, stop_after=3)
    assert stopped["status"] == "stopped"
    resumed = _train(tmp_path / "split", spec)
    assert resumed["weights_sha256"] == full["weights_sha256"] and resumed["val_top1"] == full["val_top1"]
