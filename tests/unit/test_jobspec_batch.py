"""One global batch: the spec's layout, the validate summary line, and dp refusing other GPUs than promised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hpctrain.errors import TrainingConfigError
from hpctrain.jobspec.batch import BatchLayout
from hpctrain.jobspec.models import JobSpec


def spec(resources: dict, trainer: dict) -> JobSpec:
    return JobSpec.model_validate({"name": "b", "resources": resources, "trainer": {"batch_size": 32, **trainer}})


@pytest.mark.parametrize(
    ("resources", "trainer", "layout"),
    [
        ({"nodes": 2, "gpus_per_node": 4}, {"strategy": "ddp"}, (32, 1, 8, 32, 256)),
        ({"nodes": 2, "gpus_per_node": 4}, {"strategy": "dp"}, (32, 4, 2, 128, 256)),
        ({"nodes": 1, "gpus_per_node": 0}, {"strategy": "dp"}, (32, 1, 1, 32, 32)),
        ({"nodes": 1, "gpus_per_node": 0}, {"strategy": "hogwild", "hogwild_processes": 3}, (32, 1, 3, 32, 96)),
        ({"nodes": 1, "gpus_per_node": 1}, {"strategy": "single"}, (32, 1, 1, 32, 32)),
        ({"nodes": 3, "gpus_per_node": 0, "tasks_per_node": 2}, {"strategy": "ddp"}, (32, 1, 6, 32, 192)),
    ],
)
def test_layout_per_device_per_process_and_global(resources: dict, trainer: dict, layout: tuple) -> None:
    job = spec(resources, trainer)
    got = job.batch_layout
    assert (got.per_device, got.devices_per_process, got.processes, got.per_process, got.global_batch) == layout
    assert job.global_batch_size == got.global_batch


def test_describe_names_gpus_and_processes() -> None:
    assert BatchLayout(64, 4, 2).describe() == "64 per GPU x 4 GPUs per task x 2 processes"
    assert BatchLayout(32, 1, 1).describe() == "32 per process x 1 process"


def test_validate_summary_line_shows_the_layout(tmp_path: Path) -> None:
    from hpctrain.jobspec.load import load_job
    from hpctrain.launch.plan import describe

    path = tmp_path / "dp.yaml"
    text = "name: a\ncluster: hal\nresources: {nodes: 2, gpus_per_node: 4}\ntrainer: {strategy: dp, batch_size: 64}\n"
    path.write_text(text)
    assert "global batch 512 (64 per GPU x 4 GPUs per task x 2 processes)" in describe(load_job(path))


def test_dp_refuses_other_gpus_than_the_spec_promised() -> None:
    from hpctrain.runtime.context import TaskEnv
    from hpctrain.trainer.strategies.dp import DataParallel

    env = TaskEnv(0, 1, 0, 1, 0, 1, ("n0",), "127.0.0.1", 29500, "1", 0, "single")
    with pytest.raises(TrainingConfigError, match="resources.gpus_per_node: the spec gives each dp task 2 GPUs"):
        DataParallel(promised_gpus=2).check(env, torch.device("cpu"))
    DataParallel(promised_gpus=0).check(env, torch.device("cpu"))  # a CPU job: one device, as promised
    DataParallel(promised_gpus=None).check(env, torch.device("cpu"))  # an unresolved spec: what the task sees
