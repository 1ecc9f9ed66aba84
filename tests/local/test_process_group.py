"""Real local processes forming real gloo process groups through hpctrain's runtime."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import submitit
import torch
from forked_ranks import start_ranks

from hpctrain.errors import DistributedSetupError
from hpctrain.jobspec.models import Distributed
from hpctrain.programs.launcher import TaskLauncher
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.task_env import one_node_env
from tests.net_helpers import free_port

pytestmark = pytest.mark.local_dist


def worker(rank: int, envs: list[dict[str, str]], out: Path) -> None:
    """One rank with its launcher's variables (and no other launcher's): forms the group from them alone."""
    import torch.distributed as dist

    from hpctrain.runtime.process_group import process_group
    from hpctrain.runtime.task_env import derive_task_env

    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))}
    os.environ.clear()
    os.environ.update(base | envs[rank])
    env = derive_task_env(os.environ)
    with process_group(env, Distributed(timeout_s=30), use_cuda=False, connect_timeout_s=20) as device:
        value = torch.tensor([env.global_rank + 1.0])
        dist.all_reduce(value)
        row = {
            "rank": env.global_rank,
            "source": env.source,
            "sum": value.item(),
            "backend": dist.get_backend(),
            "device": str(device),
        }
    row["destroyed"] = not dist.is_initialized()
    (out / f"row-{rank}.json").write_text(json.dumps(row))


def run_workers(envs: list[dict[str, str]], tmp_path: Path) -> list[dict[str, Any]]:
    """:func:`worker` on each env's rank, forked from the session's fork server (torch imported once)."""
    start_ranks(worker, (envs, tmp_path), len(envs), timeout_s=60)
    rows = [json.loads((tmp_path / f"row-{rank}.json").read_text()) for rank in range(len(envs))]
    return sorted(rows, key=lambda row: row["rank"])


def test_submitit_local_env_three_ranks_agree(tmp_path: Path) -> None:
    port = str(free_port())
    envs = [
        {
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_JOB_ID": "31337",
            "SUBMITIT_LOCAL_NTASKS": "3",
            "SUBMITIT_LOCAL_GLOBALID": str(rank),
            "SUBMITIT_LOCAL_LOCALID": str(rank),
            "MASTER_PORT": port,
        }
        for rank in range(3)
    ]
    rows = run_workers(envs, tmp_path)
    assert [row["sum"] for row in rows] == [6.0, 6.0, 6.0]
    assert {(row["source"], row["backend"], row["device"], row["destroyed"]) for row in rows} == {
        ("submitit-local", "gloo", "cpu", True)
    }


def test_torchrun_style_env_two_ranks_agree(tmp_path: Path) -> None:
    port = str(free_port())
    envs = [
        {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        for rank in range(2)
    ]
    rows = run_workers(envs, tmp_path)
    assert [(row["source"], row["sum"]) for row in rows] == [("torchrun", 3.0), ("torchrun", 3.0)]


def make_env(rank: int, world_size: int, port: int) -> TaskEnv:
    return one_node_env("submitit-local", rank, world_size, rank, "1", port)


def test_taken_master_port_fails_fast_on_rank_0() -> None:
    from hpctrain.runtime.process_group import process_group

    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        started = time.monotonic()
        with (
            pytest.raises(DistributedSetupError, match=f"port {port} on .* is taken; set distributed.master_port"),
            process_group(make_env(0, 2, port), Distributed(timeout_s=600), use_cuda=False),
        ):
            pass
    assert time.monotonic() - started < 10


def test_unreachable_master_fails_within_the_connect_timeout() -> None:
    from hpctrain.runtime.process_group import process_group

    started = time.monotonic()
    with (
        pytest.raises(DistributedSetupError, match="rank 1 on .* could not reach the master 127.0.0.1:") as raised,
        process_group(make_env(1, 2, free_port()), Distributed(timeout_s=600), use_cuda=False, connect_timeout_s=2),
    ):
        pass
    assert time.monotonic() - started < 10
    assert raised.value.hint and "rank 0" in raised.value.hint


def test_single_task_starts_no_process_group() -> None:
    import torch.distributed as dist

    from hpctrain.runtime.process_group import process_group

    with process_group(make_env(0, 1, free_port()), Distributed(), use_cuda=False) as device:
        assert str(device) == "cpu"
        assert not dist.is_initialized()


def submit_launcher(tmp_path: Path, spec_data: dict[str, Any], tasks: int) -> submitit.Job:
    executor = submitit.LocalExecutor(folder=tmp_path / "submitit")
    executor.update_parameters(tasks_per_node=tasks, timeout_min=5)
    return executor.submit(TaskLauncher(spec_data, str(tmp_path / "run")))


def test_launcher_runs_the_entrypoint_on_every_rank_via_submitit(tmp_path: Path) -> None:
    spec_data = {
        "name": "allreduce",
        "entrypoint": "hpctrain.examples.allreduce_check:main",
        "entrypoint_args": {"tag": "smoke"},
        "resources": {"gpus_per_node": 0, "tasks_per_node": 2},
        "distributed": {"timeout_s": 60},
    }
    results = submit_launcher(tmp_path, spec_data, tasks=2).results()
    assert [r["rank"] for r in results] == [0, 1]
    assert [r["result"]["sum"] for r in results] == [3.0, 3.0]
    assert {r["result"]["expected"] for r in results} == {3.0}
    assert {r["result"]["backend"] for r in results} == {"gloo"}
    assert {r["result"]["args"]["tag"] for r in results} == {"smoke"}
    assert all(r["hostname"] for r in results)


def test_launcher_failure_is_one_clear_line_and_a_failed_job(tmp_path: Path) -> None:
    spec_data = {
        "name": "broken",
        "entrypoint": "no_such_package_xyz.module:main",
        "resources": {"gpus_per_node": 0, "tasks_per_node": 1},
    }
    job = submit_launcher(tmp_path, spec_data, tasks=1)
    with pytest.raises(submitit.core.utils.FailedJobError):
        job.results()
    stderr = job.stderr() or ""
    assert "hpctrain: rank 0 on node " in stderr
    assert "failed: HpctrainError: entrypoint 'no_such_package_xyz.module:main'" in stderr
