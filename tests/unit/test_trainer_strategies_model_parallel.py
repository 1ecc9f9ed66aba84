"""strategy: model_parallel: the parts on their devices compute the model's forward (whole batches or
micro-batches in a wavefront), and a task without two GPUs is refused with the setting to change."""

from __future__ import annotations

import pytest
import torch
import torchvision

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskEnv
from hpctrain.trainer.strategies import build_strategy
from hpctrain.trainer.strategies.model_parallel import ModelParallel, SplitModel
from hpctrain.trainer.strategies.splitting import balanced_starts, parts_of, sequential_blocks


def one_task() -> TaskEnv:
    return TaskEnv(
        global_rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        hostnames=("localhost",),
        master_addr="127.0.0.1",
        master_port=29500,
        job_id="1",
        restart_count=0,
        source="single",
    )


@pytest.mark.parametrize("split_size", [None, 1, 3])
def test_split_model_computes_the_models_forward(split_size: int | None) -> None:
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5).eval()
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        blocks = sequential_blocks(model, "resnet18", "model_parallel")
        parts = parts_of(blocks, balanced_starts([b.params for b in blocks], 3))
        split = SplitModel(parts, [torch.device("cpu")] * 3, split_size)
        torch.testing.assert_close(split(x), expected)


def test_model_parallel_without_two_gpus_is_refused() -> None:
    spec = JobSpec.model_validate({"name": "mp", "trainer": {"strategy": "model_parallel", "arch": "resnet18"}})
    strategy = build_strategy(spec)
    assert isinstance(strategy, ModelParallel)
    with pytest.raises(TrainingConfigError, match="over 2 GPUs, but this task sees 0") as info:
        strategy.check(one_task(), torch.device("cpu"))
    assert "resources.gpus_per_node" in (info.value.hint or "")
