"""The trainer end to end with the device-decode data path, run here on the CPU device.

``resolve_decoder`` refuses 'gpu' without CUDA (as it should for users); the
tests lift that refusal so the whole path (bytes + boxes from loader workers,
``EncodedBatch.to(device)`` in the training and evaluation loops, the sampler's
resume) runs where no GPU is. tests/local/test_decode_gpu.py repeats it on CUDA.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_harness import context, job_spec, stop_at

from hpctrain.jobspec.models import JobSpec
from hpctrain.trainer.data import loaders as data
from hpctrain.trainer.data.device_input import to_model_input
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


def test_loaders_give_the_same_samples_and_crops_in_both_modes(data_root: Path) -> None:
    cpu_spec, device_spec = _spec(data_root, "cpu"), _spec(data_root, "gpu")
    kwargs = {"rank": 1, "world_size": 2, "device_is_cuda": False, "epoch_seed": 5, "batch_size": 8}
    cpu = data.build_loaders(cpu_spec.data, cpu_spec.trainer, **kwargs)
    device = data.build_loaders(device_spec.data, device_spec.trainer, **kwargs)
    for loaders in (cpu, device):
        loaders.set_epoch(1)
        loaders.train_sampler.set_start_batch(1, 8)  # mid-epoch, as after a resume
    for cpu_loader, device_loader in ((cpu.train_loader, device.train_loader), (cpu.val_loader, device.val_loader)):
        (cpu_images, cpu_labels), (encoded, device_labels) = next(iter(cpu_loader)), next(iter(device_loader))
        assert torch.equal(cpu_labels, device_labels)
        cpu_input = to_model_input(cpu_images, "cpu", channels_last=False)
        device_input = to_model_input(encoded, "cpu", channels_last=False)
        assert device_input.shape == cpu_input.shape
        assert (device_input - cpu_input).abs().mean() < 0.05  # a few levels of 255: decoder and resampler


def test_training_on_device_decoded_batches(data_root: Path, tmp_path: Path, one_thread: None) -> None:
    result = _train(tmp_path, _spec(data_root, "gpu", epochs=1))
    assert result["status"] == "completed" and result["global_step"] == 3 and 0 < result["train_loss"] < 10


def test_resume_is_exact_on_the_device_decode_path(data_root: Path, tmp_path: Path, one_thread: None) -> None:
    spec = _spec(data_root, "gpu", max_steps_per_epoch=4, deterministic=True)
    full = _train(tmp_path / "full", spec)
    stopped = _train(tmp_path / "split", spec, stop_after=3)
    assert stopped["status"] == "stopped"
    resumed = _train(tmp_path / "split", spec)
    assert resumed["weights_sha256"] == full["weights_sha256"] and resumed["val_top1"] == full["val_top1"]
