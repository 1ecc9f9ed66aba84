"""trainer.compile: the model compiles in place (same checkpoint keys), and a compile failure is a config error."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from trainer_harness import context, job_spec

from hpctrain.contract.rundir import checkpoints_dir, summary_path
from hpctrain.errors import TrainingConfigError
from hpctrain.trainer import building  # build_optimization compiles the model
from hpctrain.trainer.checkpoint import CheckpointManager
from hpctrain.trainer.compiling import compile_model
from hpctrain.trainer.models import build_model
from hpctrain.trainer.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def test_a_compiled_run_trains_and_checkpoints_the_plain_keys(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # aot_eager runs Dynamo and AOTAutograd (the graphs, the compiled backward) without Inductor's C++ build,
    # which takes minutes for a resnet on two CPU cores; test_inductor_compiles_a_small_model covers Inductor.
    monkeypatch.setattr(building, "compile_model", functools.partial(compile_model, backend="aot_eager"))
    spec = job_spec(data_root, trainer={"compile": True, "max_steps_per_epoch": 2})
    trainer = Trainer(context(tmp_path, spec))
    result = trainer.fit()
    assert result["status"] == "completed" and result["global_step"] == 2
    assert trainer.module._compiled_call_impl is not None  # compiled in place, not wrapped
    plain = build_model(spec.trainer, 4, image_size=32).state_dict()
    state = CheckpointManager(checkpoints_dir(tmp_path)).load()
    assert list(state["model"]) == list(plain)  # no "_orig_mod." prefixes: resumes and weights files work


def test_a_compile_failure_is_a_config_error_with_a_hint(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_backend(graph: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(building, "compile_model", functools.partial(compile_model, backend=broken_backend))
    spec = job_spec(data_root, trainer={"compile": True})
    with pytest.raises(TrainingConfigError) as info:
        Trainer(context(tmp_path, spec)).fit()
    assert "torch.compile could not compile the model" in info.value.message
    assert "no working C++ compiler found" in info.value.message
    assert info.value.hint is not None and "trainer.compile: false" in info.value.hint
    summary = json.loads(summary_path(tmp_path).read_text())
    assert summary["status"] == "failed" and "trainer.compile" in summary["error"]


def test_hogwild_with_compile_is_refused_before_forking(data_root: Path, tmp_path: Path) -> None:
    spec = job_spec(data_root, trainer={"compile": True, "strategy": "hogwild"})
    with pytest.raises(TrainingConfigError, match="trainer.compile"):
        Trainer(context(tmp_path, spec)).fit()


def test_inductor_compiles_a_small_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real compiler (Inductor, C++ on the CPU) on a model small enough to build in well under a minute."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    keys = list(model.state_dict())
    compile_model(model)
    images, targets = torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,))
    nn.functional.cross_entropy(model(images), targets).backward()
    assert model._compiled_call_impl is not None and list(model.state_dict()) == keys
    assert all(p.grad is not None for p in model.parameters())
