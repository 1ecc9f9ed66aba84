"""Model building and weights files, SGD and its schedule, and mixed precision."""

from __future__ import annotations

import contextlib
import math
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import Trainer
from hpctrain.trainer.models import build_model, resolve_num_classes
from hpctrain.trainer.optim import build_optimizer, build_scheduler, lr_factor, scaled_lr
from hpctrain.trainer.precision import Precision, to_memory_format

CPU = torch.device("cpu")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


# --- models and weights files -----------------------------------------------------------------


def test_builds_a_torchvision_model_with_the_right_head() -> None:
    model = build_model(Trainer(arch="resnet18"), num_classes=7)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 7)


def test_aux_heads_are_off_so_training_returns_plain_logits() -> None:
    model = build_model(Trainer(arch="googlenet"), num_classes=4).train()
    assert isinstance(model(torch.randn(2, 3, 64, 64)), torch.Tensor)


def test_unknown_arch_suggests_close_names() -> None:
    with pytest.raises(TrainingConfigError) as info:
        build_model(Trainer(arch="resnet51"), num_classes=10)
    assert info.value.message.startswith("trainer.arch: 'resnet51'")
    assert "resnet50" in info.value.hint


def test_num_classes_comes_from_the_dataset_unless_set() -> None:
    assert resolve_num_classes(Trainer(), 10) == 10
    assert resolve_num_classes(Trainer(num_classes=1000), 10) == 1000
    with pytest.raises(TrainingConfigError, match="trainer.num_classes"):
        resolve_num_classes(Trainer(num_classes=5), 10)


@pytest.fixture(scope="module")
def resnet18_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return build_model(Trainer(arch="resnet18"), num_classes=10).state_dict()


def _assert_same(model: nn.Module, state: dict[str, torch.Tensor], skip: tuple[str, ...] = ()) -> None:
    for key, value in model.state_dict().items():
        if not key.startswith(skip):
            assert torch.equal(value, state[key]), key


def test_weights_round_trip(tmp_path: Path, resnet18_state: dict) -> None:
    path = tmp_path / "w.pt"
    torch.save(resnet18_state, path)
    _assert_same(build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10), resnet18_state)


def test_weights_inside_a_ddp_checkpoint(tmp_path: Path, resnet18_state: dict) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {f"module.{k}": v for k, v in resnet18_state.items()}, "epoch": 3}, path)
    _assert_same(build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10), resnet18_state)


def test_a_different_class_count_reinitialises_only_the_head(tmp_path: Path, resnet18_state: dict) -> None:
    path = tmp_path / "w.pt"
    torch.save({"state_dict": resnet18_state}, path)
    model = build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=5)
    assert model.fc.weight.shape == (5, 512)
    _assert_same(model, resnet18_state, skip=("fc.",))


def test_weights_from_another_model_are_refused(tmp_path: Path, resnet18_state: dict) -> None:
    path = tmp_path / "w.pt"
    torch.save({k: v for k, v in resnet18_state.items() if k != "layer1.0.conv1.weight"}, path)
    with pytest.raises(TrainingConfigError, match=r"trainer.weights: .*missing: \['layer1.0.conv1.weight'\]"):
        build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10)
    torch.save({**resnet18_state, "conv1.weight": torch.zeros(64, 3, 3, 3)}, path)
    with pytest.raises(TrainingConfigError, match="shape mismatch"):
        build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10)


class _RunsCodeWhenUnpickled:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (open, (str(self.marker), "w"))  # unpickling would create the marker file


def test_a_pickled_object_is_refused_and_never_executed(tmp_path: Path) -> None:
    path, marker = tmp_path / "evil.pt", tmp_path / "marker"
    torch.save({"model": _RunsCodeWhenUnpickled(marker)}, path)
    with pytest.raises(TrainingConfigError, match="trainer.weights: .*refusing") as info:
        build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10)
    assert "state_dict" in info.value.hint
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"not a torch file", None])
def test_missing_or_unreadable_weights_file(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "w.pt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TrainingConfigError, match=f"trainer.weights: .*{path.name}"):
        build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10)


def test_a_file_that_is_not_a_state_dict(tmp_path: Path) -> None:
    path = tmp_path / "w.pt"
    torch.save([torch.zeros(1)], path)
    with pytest.raises(TrainingConfigError, match="not a state_dict"):
        build_model(Trainer(arch="resnet18", weights=str(path)), num_classes=10)


# --- optimizer and schedule -------------------------------------------------------------------


def test_linear_scaling_rule() -> None:
    assert scaled_lr(Trainer(lr=0.1), 1024) == pytest.approx(0.4)
    assert scaled_lr(Trainer(lr=0.1), 64) == pytest.approx(0.025)
    assert scaled_lr(Trainer(lr=0.1, lr_scaling="none"), 1024) == 0.1


def test_optimizer_settings() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(1, 3, 5, 5))
    optimizer = build_optimizer(model, Trainer(lr=0.1, momentum=0.8, weight_decay=5e-4), global_batch_size=512)
    (group,) = optimizer.param_groups
    assert group["lr"] == pytest.approx(0.2) and group["momentum"] == 0.8 and group["weight_decay"] == 5e-4
    assert len(group["params"]) == 6
    assert group["fused"] is True  # torch has a fused SGD kernel on the CPU (and on CUDA)


def test_optimizer_falls_back_to_foreach_without_a_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    real_sgd = torch.optim.SGD

    def no_fused(params: object, **settings: object) -> torch.optim.SGD:
        if settings.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real_sgd(params, **settings)

    monkeypatch.setattr(torch.optim, "SGD", no_fused)
    optimizer = build_optimizer(nn.Linear(2, 2), Trainer(), 256)
    assert optimizer.defaults["foreach"] is True and not optimizer.defaults["fused"]


def test_no_weight_decay_on_norm_layers_and_biases() -> None:
    model = build_model(Trainer(arch="resnet18"), num_classes=10)
    optimizer = build_optimizer(model, Trainer(no_weight_decay_on_norm=True, weight_decay=1e-4), 256)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    exempt = {names[id(p)] for p in no_decay["params"]}
    assert exempt == {n for n in names.values() if "bn" in n or "downsample.1" in n or n == "fc.bias"}
    assert {names[id(p)] for p in decay["params"]} == set(names.values()) - exempt
    assert "fc.weight" not in exempt and "conv1.weight" not in exempt


def _lrs(spec: Trainer, steps_per_epoch: int, steps: int) -> list[float]:
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = build_scheduler(optimizer, spec, steps_per_epoch)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_step_schedule_drops_at_the_reference_epochs() -> None:
    lrs = _lrs(Trainer(epochs=90, schedule="step"), steps_per_epoch=10, steps=900)
    assert lrs[0] == lrs[299] == 1.0
    assert lrs[300] == pytest.approx(0.1) and lrs[599] == pytest.approx(0.1)
    assert lrs[600] == pytest.approx(0.01) and lrs[800] == pytest.approx(0.001) and lrs[899] == pytest.approx(0.001)


def test_warmup_ramps_linearly_to_the_base_rate() -> None:
    factor = lr_factor(Trainer(warmup_epochs=2, schedule="constant"), steps_per_epoch=10)
    assert [factor(s) for s in (0, 9, 19, 20, 500)] == pytest.approx([0.05, 0.5, 1.0, 1.0, 1.0])
    ramp = [factor(s) for s in range(20)]
    assert all(b - a == pytest.approx(0.05) for a, b in zip(ramp, ramp[1:]))
    fractional = lr_factor(Trainer(warmup_epochs=0.5, schedule="constant"), steps_per_epoch=10)
    assert fractional(0) == pytest.approx(0.2) and fractional(4) == 1.0


def test_cosine_runs_from_the_base_rate_to_zero() -> None:
    factor = lr_factor(Trainer(epochs=10, schedule="cosine"), steps_per_epoch=10)
    assert [factor(s) for s in (0, 50, 100, 150)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    warm = lr_factor(Trainer(epochs=10, schedule="cosine", warmup_epochs=1), steps_per_epoch=10)
    assert warm(9) == pytest.approx(1.0) and warm(10) == pytest.approx(1.0)
    assert warm(55) == pytest.approx(0.5) and warm(100) == pytest.approx(0.0)
    assert warm(30) == pytest.approx(0.5 * (1 + math.cos(math.pi * 20 / 90)))


def test_scheduler_resumes_mid_epoch() -> None:
    spec = Trainer(epochs=4, schedule="cosine", warmup_epochs=1, lr=0.1)
    model = nn.Linear(2, 2)

    def fresh() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
        optimizer = build_optimizer(model, spec, 256)
        return optimizer, build_scheduler(optimizer, spec, steps_per_epoch=7)

    optimizer, scheduler = fresh()
    for _ in range(12):
        optimizer.step()
        scheduler.step()
    saved = (optimizer.state_dict(), scheduler.state_dict())
    assert saved[1]["lr_lambdas"] == [None]  # only the step count is stored, not the schedule
    expected = []
    for _ in range(5):
        optimizer.step()
        scheduler.step()
        expected.append(scheduler.get_last_lr()[0])

    optimizer, scheduler = fresh()
    optimizer.load_state_dict(saved[0])
    scheduler.load_state_dict(saved[1])
    resumed = []
    for _ in range(5):
        optimizer.step()
        scheduler.step()
        resumed.append(scheduler.get_last_lr()[0])
    assert resumed == expected


# --- precision --------------------------------------------------------------------------------


def test_fp16_on_cpu_is_a_config_error() -> None:
    with pytest.raises(TrainingConfigError) as info:
        Precision("fp16", CPU)
    assert info.value.message == "trainer.precision: fp16 needs a CUDA GPU"
    assert "bf16" in info.value.hint


def test_bf16_autocast_on_cpu() -> None:
    precision = Precision("bf16", CPU)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with precision.autocast():
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32
    assert not precision.scaler.is_enabled()
    with Precision("fp32", CPU).autocast():
        assert (a @ b).dtype == torch.float32


def test_a_training_step_in_bf16_updates_the_weights() -> None:
    torch.manual_seed(0)
    precision, model = Precision("bf16", CPU), nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = precision.prepare(model, optimizer)
    before = model.weight.detach().clone()
    with precision.autocast():
        loss = nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(0, 3, (16,)))
    precision.backward(loss, optimizer)
    precision.step(optimizer)
    assert model.weight.dtype == torch.float32 and not torch.equal(model.weight, before)


def test_state_dict_round_trip_and_other_precisions_ignored() -> None:
    precision = Precision("bf16", CPU)
    state = precision.state_dict()
    assert state["precision"] == "bf16"
    precision.load_state_dict(state)
    Precision("fp32", CPU).load_state_dict(state)  # switching precision on resume starts a fresh scaler


@pytest.fixture
def no_apex(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "apex", None)  # import apex -> ImportError, even where it is installed
    monkeypatch.setitem(sys.modules, "apex.amp", None)


@pytest.mark.parametrize(("level", "equivalent"), [("O0", "fp32"), ("O1", "fp16"), ("O2", "fp16"), ("O3", "bf16")])
def test_apex_levels_without_apex_name_the_torch_amp_equivalent(no_apex: None, level: str, equivalent: str) -> None:
    with pytest.raises(TrainingConfigError) as info:
        Precision(level, torch.device("cuda"))
    assert (
        info.value.message.startswith(f"trainer.precision: {level}") and "Apex is not installed" in info.value.message
    )
    assert info.value.hint.startswith("use trainer.precision: ") and equivalent in info.value.hint


@pytest.fixture
def fake_apex(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    calls = types.SimpleNamespace(initialize=[], scaled=[])

    @contextlib.contextmanager
    def scale_loss(loss: torch.Tensor, optimizer: object) -> Iterator[torch.Tensor]:
        calls.scaled.append(loss)
        yield loss * 2

    def initialize(model: nn.Module, optimizer: object, opt_level: str, verbosity: int) -> tuple:
        calls.initialize.append(opt_level)
        return model, optimizer

    amp = types.ModuleType("apex.amp")
    amp.initialize, amp.scale_loss = initialize, scale_loss
    amp.state_dict, amp.load_state_dict = lambda: {"loss_scaler0": 1.0}, lambda state: None
    apex = types.ModuleType("apex")
    apex.amp = amp
    monkeypatch.setitem(sys.modules, "apex", apex)
    monkeypatch.setitem(sys.modules, "apex.amp", amp)
    return calls


def test_apex_needs_a_gpu(fake_apex: types.SimpleNamespace) -> None:
    with pytest.raises(TrainingConfigError, match="Apex O2 needs a CUDA GPU"):
        Precision("O2", CPU)


def test_apex_drives_initialize_and_loss_scaling(fake_apex: types.SimpleNamespace) -> None:
    precision = Precision("O1", torch.device("cuda"))
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer = precision.prepare(model, optimizer)
    assert fake_apex.initialize == ["O1"]
    precision.backward(model(torch.ones(1, 2)).sum(), optimizer)
    assert len(fake_apex.scaled) == 1 and model.bias.grad.item() == 2.0  # backward ran on the scaled loss
    precision.step(optimizer)
    assert precision.state_dict()["amp"] == {"loss_scaler0": 1.0}


def test_channels_last() -> None:
    model = to_memory_format(nn.Conv2d(3, 8, 3), channels_last=True)
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    images = to_memory_format(torch.randn(2, 3, 8, 8), channels_last=True)
    assert images.is_contiguous(memory_format=torch.channels_last)
    flat = torch.randn(2, 3)
    assert to_memory_format(flat, channels_last=True) is flat
    assert to_memory_format(images, channels_last=False) is images


@pytest.mark.gpu
@needs_cuda
def test_fp16_autocast_and_loss_scaling_on_cuda() -> None:
    device = torch.device("cuda")
    precision = Precision("fp16", device)
    model = nn.Linear(8, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with precision.autocast():
        out = model(torch.randn(4, 8, device=device))
    assert out.dtype == torch.float16 and model.weight.dtype == torch.float32
    assert precision.scaler.is_enabled()
    precision.backward(out.float().mean() * 1e-3, optimizer)  # small: scaled grads stay finite in fp16
    precision.step(optimizer)

    scale = precision.scaler.get_scale()
    optimizer.zero_grad()
    before = model.weight.detach().clone()
    precision.backward(model(torch.full((1, 8), float("inf"), device=device)).sum(), optimizer)
    precision.step(optimizer)  # inf gradients: step skipped, scale backed off
    assert torch.equal(model.weight, before) and precision.scaler.get_scale() < scale

    restored = Precision("fp16", device)
    restored.load_state_dict(precision.state_dict())
    assert restored.scaler.get_scale() == precision.scaler.get_scale()


@pytest.mark.gpu
@needs_cuda
def test_bf16_on_cuda() -> None:
    if not torch.cuda.is_bf16_supported():
        with pytest.raises(TrainingConfigError, match="Ampere"):
            Precision("bf16", torch.device("cuda"))
        return
    with Precision("bf16", torch.device("cuda")).autocast():
        assert (torch.randn(4, 4, device="cuda") @ torch.randn(4, 4, device="cuda")).dtype == torch.bfloat16
