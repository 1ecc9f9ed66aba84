"""Device binding and NCCL on real GPUs. Pass on a 1-GPU box; skipped without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import submitit
import torch

from hpctrain.programs.launcher import TaskLauncher
from hpctrain.runtime.context import TaskEnv
from tests.net_helpers import free_port

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.local_dist,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def make_env(rank: int = 0, world_size: int = 1, local_world_size: int = 1, port: int = 0) -> TaskEnv:
    return TaskEnv(
        global_rank=rank,
        world_size=world_size,
        local_rank=rank,
        local_world_size=local_world_size,
        node_rank=0,
        num_nodes=1,
        hostnames=("localhost",),
        master_addr="127.0.0.1",
        master_port=port or free_port(),
        job_id="1",
        restart_count=0,
        source="submitit-local",
    )


def run_python(code: str, env: dict[str, str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code], env=os.environ | env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_task_sees_all_gpus_binds_cuda_local_rank() -> None:
    from hpctrain.runtime.process_group import task_device

    device = task_device(make_env(), use_cuda=True)
    assert device == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 0
    assert torch.ones(1, device=device).item() == 1.0


def test_one_gpu_bound_per_task_is_cuda_0_whatever_the_local_rank() -> None:
    # What Slurm's --gpus-per-task=1 gives local rank 1: one visible GPU.
    code = """
import json, torch
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.process_group import task_device
env = TaskEnv(1, 2, 1, 2, 0, 1, ("localhost",), "127.0.0.1", 20000, "1", 0, "submitit-local")
device = task_device(env, use_cuda=True)
print(json.dumps({"device": str(device), "count": torch.cuda.device_count(),
                  "ok": torch.ones(1, device=device).item()}))
"""
    row = run_python(code, {"CUDA_VISIBLE_DEVICES": "0"})
    assert row == {"device": "cuda:0", "count": 1, "ok": 1.0}


def test_one_process_nccl_group_all_reduces_on_the_gpu() -> None:
    import torch.distributed as dist

    from hpctrain.runtime.process_group import start_process_group, task_device

    env = make_env()
    device = task_device(env, use_cuda=True)
    start_process_group(env, "nccl", device, timeout_s=60, connect_timeout_s=30)
    try:
        assert dist.get_backend() == "nccl"
        value = torch.tensor([5.0], device=device)
        dist.all_reduce(value)
        assert value.item() == 5.0
    finally:
        dist.destroy_process_group()


def test_launcher_on_one_gpu_via_submitit(tmp_path: Path) -> None:
    spec_data = {
        "name": "gpu-check",
        "entrypoint": "hpctrain.examples.allreduce_check:main",
        "resources": {"gpus_per_node": 1, "tasks_per_node": 1},
    }
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=1, gpus_per_node=1, timeout_min=5)
    (result,) = executor.submit(TaskLauncher(spec_data, str(tmp_path / "run"))).results()
    assert result["result"]["device"] == "cuda:0"
    assert result["result"]["sum"] == 1.0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_ranks_nccl_on_two_gpus(tmp_path: Path) -> None:
    spec_data = {
        "name": "gpu-check",
        "entrypoint": "hpctrain.examples.allreduce_check:main",
        "resources": {"gpus_per_node": 2, "tasks_per_node": 2},
    }
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=2, gpus_per_node=2, timeout_min=5)
    results = executor.submit(TaskLauncher(spec_data, str(tmp_path / "run"))).results()
    assert [r["result"]["device"] for r in results] == ["cuda:0", "cuda:1"]
    assert {r["result"]["backend"] for r in results} == {"nccl"}
    assert {r["result"]["sum"] for r in results} == {3.0}
