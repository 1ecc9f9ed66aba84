"""The train step never waits for the device: values are read at log points only.

On the CPU this is structural (every tensor read that would sync a GPU raises
during the steps); on a GPU, ``torch.cuda.set_sync_debug_mode("error")`` makes
any synchronising CUDA call in the steps an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from hpctrain.jobspec.models import Trainer
from hpctrain.trainer.optim import build_optimizer, build_scheduler
from hpctrain.trainer.precision import Precision
from hpctrain.trainer.state import EpochSums, StepWindow
from hpctrain.trainer.step import TrainStep
from hpctrain.trainer.strategies.base import Strategy

READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")
STEPS = 4


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 6),
    ).to(device)


def _train_step(precision: str, device: torch.device) -> TrainStep:
    model, spec = _model(device), Trainer(warmup_epochs=1, schedule="cosine", epochs=2)
    optimizer = build_optimizer(model, spec, 256)
    return TrainStep(
        model,
        model,
        optimizer,
        build_scheduler(optimizer, spec, STEPS),
        Precision(precision, device),
        nn.CrossEntropyLoss(label_smoothing=0.1),
        Strategy(),
        device,
    )


def _batches(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pin = device.type == "cuda"
    images = [torch.randn(4, 3, 8, 8) for _ in range(STEPS)]
    targets = [torch.randint(0, 6, (4,)) for _ in range(STEPS)]
    if pin:
        images, targets = [i.pin_memory() for i in images], [t.pin_memory() for t in targets]
    return list(zip(images, targets, strict=True))


def _steps(train_step: TrainStep, batches: list, window: StepWindow, sums: EpochSums) -> None:
    for images, targets in batches:
        out = train_step(images, targets)
        sums.add(out)
        window.add(out, data_s=0.0, images=targets.shape[0])


@contextlib.contextmanager
def _no_host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    calls: list[str] = []
    with monkeypatch.context() as patch:
        for name in READS:

            def refuse(self: torch.Tensor, *args: object, _name: str = name, **kwargs: object) -> None:
                calls.append(_name)
                raise AssertionError(f"Tensor.{_name}() inside the train step would wait for the GPU")

            patch.setattr(torch.Tensor, name, refuse)
        yield calls


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_no_tensor_is_read_on_the_host_between_log_points(monkeypatch: pytest.MonkeyPatch, precision: str) -> None:
    device = torch.device("cpu")
    train_step, batches = _train_step(precision, device), _batches(device)
    window, sums = StepWindow(), EpochSums(device, is_main=True)
    with _no_host_reads(monkeypatch) as calls:
        with pytest.raises(AssertionError, match="wait for the GPU"):
            torch.ones(1).sum().item()  # the guard is on
        calls.clear()
        _steps(train_step, batches, window, sums)
    assert calls == []
    values = window.values(world_size=1, lr=train_step.optimizer.param_groups[0]["lr"])  # the log point reads
    assert values["loss"] > 0 and window.steps == STEPS
    assert train_step.scheduler.last_epoch == STEPS  # the schedule advanced every step without asking


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_no_cuda_sync_between_log_points(precision: str) -> None:
    device = torch.device("cuda", torch.cuda.current_device())
    train_step, batches = _train_step(precision, device), _batches(device)
    assert train_step.optimizer.defaults["fused"] is True
    window, sums = StepWindow(), EpochSums(device, is_main=True)
    _steps(train_step, batches[:1], window, sums)  # first step: lazy CUDA initialisation may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(train_step, batches[1:], window, sums)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert window.values(world_size=1, lr=0.0)["loss"] > 0
