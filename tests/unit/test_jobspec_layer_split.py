"""Cutting a model into consecutive parts (pipeline, model_parallel): the sequential form computes the
model's forward, the split is balanced or named, and the spec checks name the key to change."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torchvision

from hpctrain.errors import SpecError, TrainingConfigError
from hpctrain.jobspec.layer_split import BLOCKS, check_layer_split, family_of
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.trainer.strategies.splitting import (
    balanced_starts,
    choose_starts,
    named_starts,
    parts_of,
    sequential_blocks,
)


def model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.get_model(arch, weights=None, num_classes=5).eval()


# -- balancing: a pure function of block weights ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("weights", "parts", "starts"),
    [
        ([1, 1, 1, 1], 2, [0, 2]),
        ([10, 1, 1, 1, 1], 2, [0, 1]),
        ([1, 1, 1, 1, 10], 2, [0, 4]),
        ([2, 2, 2, 1, 1, 1, 1, 1, 1], 3, [0, 2, 5]),
        ([1, 2, 3], 3, [0, 1, 2]),
        ([0, 0, 5, 0, 5, 0], 2, [0, 3]),
    ],
)
def test_balanced_starts_minimise_the_heaviest_part(weights: list[float], parts: int, starts: list[int]) -> None:
    assert balanced_starts(weights, parts) == starts


def test_balanced_starts_need_a_block_per_part() -> None:
    with pytest.raises(ValueError, match="3 blocks into 4"):
        balanced_starts([1, 1, 1], 4)


# -- the sequential form ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "regnet_x_400mf"])
def test_sequential_form_computes_the_models_forward(arch: str) -> None:
    net = model(arch)
    blocks = sequential_blocks(net, arch, "pipeline")
    assert len(blocks) == BLOCKS[arch]
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = net(x)
        for part in parts_of(blocks, balanced_starts([b.params for b in blocks], 3)):
            x = part(x)
    torch.testing.assert_close(x, expected)


def test_parts_share_the_models_modules_so_keys_stay_torchvision_keys() -> None:
    net = model("resnet18")
    parts = parts_of(sequential_blocks(net, "resnet18", "pipeline"), [0, 6])
    assert {id(p) for part in parts for p in part.parameters()} == {id(p) for p in net.parameters()}
    assert list(net.state_dict()) == list(model("resnet18").state_dict())


def test_unsupported_arch_is_refused_naming_the_supported_ones() -> None:
    with pytest.raises(TrainingConfigError, match="trainer.arch: 'googlenet' cannot be cut.*resnet\\*"):
        sequential_blocks(model("googlenet"), "googlenet", "pipeline")


def test_split_by_params_and_by_names() -> None:
    blocks = sequential_blocks(model("resnet18"), "resnet18", "pipeline")
    names = [b.name for b in blocks]
    by_params = choose_starts(blocks, 2, balance="params", split_points=[], key="trainer.pipeline")
    assert names[by_params[1]] == "layer4.1"  # layer4 holds most of resnet18's weights
    named = choose_starts(blocks, 3, balance="params", split_points=["layer2", "layer4"], key="trainer.pipeline")
    assert [names[i] for i in named] == ["conv1", "layer2.0", "layer4.0"]
    assert named_starts(blocks, ["layer3.1"], "k") == [0, names.index("layer3.1")]


def test_split_by_measured_time_gives_a_valid_split_and_changes_no_weights() -> None:
    net = model("resnet18").train()
    before = {key: value.clone() for key, value in net.state_dict().items()}
    blocks = sequential_blocks(net, "resnet18", "pipeline")
    starts = choose_starts(
        blocks, 4, balance="time", split_points=[], key="trainer.pipeline", sample=torch.randn(2, 3, 32, 32)
    )
    assert starts[0] == 0 and starts == sorted(set(starts)) and len(starts) == 4 and starts[-1] < len(blocks)
    for key, value in net.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize(
    ("points", "message"),
    [
        (["layer9"], "'layer9' is not a block"),
        (["layer4", "layer2"], "not in forward order"),
    ],
)
def test_bad_split_points_name_the_key(points: list[str], message: str) -> None:
    blocks = sequential_blocks(model("resnet18"), "resnet18", "pipeline")
    with pytest.raises(TrainingConfigError, match=f"trainer.pipeline.split_points: .*{message}|{message}") as info:
        choose_starts(blocks, len(points) + 1, balance="params", split_points=points, key="trainer.pipeline")
    assert "trainer.pipeline.split_points" in str(info.value)


def test_more_parts_than_blocks_is_refused() -> None:
    blocks = sequential_blocks(model("regnet_x_400mf"), "regnet_x_400mf", "pipeline")
    with pytest.raises(TrainingConfigError, match="trainer.pipeline: 11 parts, but this model has only 10 blocks"):
        choose_starts(blocks, 11, balance="params", split_points=[], key="trainer.pipeline")


def test_every_block_count_names_a_supported_arch() -> None:
    assert all(family_of(arch) for arch in BLOCKS)


# -- the spec checks (torch-free) ------------------------------------------------------------------------------
def spec(trainer: dict, resources: dict | None = None) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "p", "trainer": {"arch": "resnet18", "batch_size": 8, **trainer}, "resources": resources or {}}
    )


def problems(trainer: dict, resources: dict | None = None) -> dict[str, str]:
    """Each key's messages, joined."""
    found: dict[str, str] = {}
    for problem in check_layer_split(spec(trainer, resources)):
        found[problem.key] = " | ".join(filter(None, [found.get(problem.key), problem.message]))
    return found


def test_a_good_pipeline_spec_has_no_problems() -> None:
    pipeline = {"stages": 2, "microbatches": 4, "split_points": ["layer3"]}
    assert problems({"strategy": "pipeline", "pipeline": pipeline}, {"tasks_per_node": 4}) == {}


def test_pipeline_spec_problems_name_their_keys() -> None:
    found = problems(
        {"strategy": "pipeline", "pipeline": {"stages": 2, "microbatches": 3}, "precision": "fp16"},
        {"tasks_per_node": 3},
    )
    assert "3 tasks" in found["trainer.pipeline.stages"] and "not a multiple of 2" in found["trainer.pipeline.stages"]
    assert "does not divide trainer.batch_size 8" in found["trainer.pipeline.microbatches"]
    assert "use fp32 or bf16" in found["trainer.precision"]
    found = problems({"strategy": "pipeline", "pipeline": {"stages": 4, "microbatches": 2}}, {"tasks_per_node": 4})
    assert found == {
        "trainer.pipeline.microbatches": "schedule 1f1b needs at least as many micro-batches as stages (4), not 2; "
        "raise it, or use schedule: gpipe"
    }


def test_pipeline_stages_beyond_the_archs_blocks() -> None:
    pipeline = {"stages": 16, "microbatches": 1, "schedule": "gpipe"}
    found = problems({"strategy": "pipeline", "pipeline": pipeline}, {"tasks_per_node": 16})
    assert found == {
        "trainer.pipeline.stages": "16 parts, but resnet18 has only 15 blocks to cut between; use at most 15"
    }


def test_pipeline_split_points_must_match_the_stages_and_the_arch() -> None:
    found = problems(
        {"strategy": "pipeline", "pipeline": {"stages": 3, "split_points": ["features"]}}, {"tasks_per_node": 3}
    )
    assert "1 names for 3 parts" in found["trainer.pipeline.split_points"]
    found = problems({"strategy": "pipeline", "pipeline": {"split_points": ["features"]}}, {"tasks_per_node": 2})
    assert "features not in resnet18's blocks" in found["trainer.pipeline.split_points"]


def test_unsplittable_arch_names_trainer_arch() -> None:
    found = problems({"strategy": "pipeline", "arch": "vit_b_16"}, {"tasks_per_node": 2})
    assert "'vit_b_16' cannot be cut into stages" in found["trainer.arch"] and "resnet*" in found["trainer.arch"]


def test_model_parallel_needs_two_gpus_and_one_task() -> None:
    found = problems({"strategy": "model_parallel"}, {"gpus_per_node": 1})
    assert "at least 2 GPUs" in found["trainer.strategy"]
    found = problems({"strategy": "model_parallel"}, {"gpus_per_node": 2, "nodes": 2})
    assert "runs in one task" in found["trainer.strategy"]
    assert problems({"strategy": "model_parallel"}, {"gpus_per_node": 2}) == {}
    assert spec({"strategy": "model_parallel"}, {"gpus_per_node": 4}).tasks_per_node == 1


def test_pipeline_global_batch_counts_pipelines_not_tasks() -> None:
    job = spec({"strategy": "pipeline", "pipeline": {"stages": 2}}, {"tasks_per_node": 4, "nodes": 2})
    assert job.world_size == 8 and job.global_batch_size == 8 * 4


def test_load_job_reports_pipeline_problems_with_their_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    path = tmp_path / "job.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            name: job
            data:
              root: /datasets/imagenet
            resources:
              tasks_per_node: 3
            trainer:
              strategy: pipeline
              batch_size: 8
              pipeline:
                stages: 2
                microbatches: 3
                split_points: [layer2.x-y]
            """
        )
    )
    with pytest.raises(SpecError) as info:
        load_job(path)
    keys = {p.key: p.line for p in info.value.problems}
    assert keys == {"trainer.pipeline.split_points.0": 12}  # a malformed name stops the model before cross checks
    path.write_text(path.read_text().replace("[layer2.x-y]", "[layer3]"))
    with pytest.raises(SpecError) as info:
        load_job(path)
    assert {p.key: p.line for p in info.value.problems} == {
        "trainer.pipeline.stages": 10,
        "trainer.pipeline.microbatches": 11,
    }
