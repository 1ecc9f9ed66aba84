"""The dry-run rank table and the two decisions it shares with the compute nodes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hpctrain.errors import DistributedSetupError, UsageError
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.rank_plan import (
    DERIVED_PORT_TEXT,
    choose_backend,
    local_visible_devices,
    plan_ranks,
    render_rank_table,
    select_device_index,
)


def make_spec(**sections: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", **sections})


@pytest.mark.parametrize(
    ("local_rank", "local_world_size", "visible", "count", "expected"),
    [
        (0, 1, None, 1, 0),  # one GPU, one task
        (3, 4, "0,1,2,3", 4, 3),  # every task sees the node's GPUs
        (3, 4, "4,5,6,7", 4, 3),  # ... whatever their physical numbers
        (3, 4, "2", 1, 0),  # Slurm bound one GPU per task
        (3, 4, "GPU-5f1e", 1, 0),  # ... given as a UUID
        (1, 2, None, 8, 1),  # fewer tasks than GPUs
    ],
)
def test_select_device_index(
    local_rank: int, local_world_size: int, visible: str | None, count: int, expected: int
) -> None:
    assert select_device_index(local_rank, local_world_size, visible, count) == expected


def test_select_device_index_more_tasks_than_gpus() -> None:
    with pytest.raises(DistributedSetupError, match="local rank 2 of 4") as raised:
        select_device_index(2, 4, "0,1", 2)
    assert raised.value.hint and "tasks_per_node" in raised.value.hint


def test_select_device_index_no_gpu() -> None:
    with pytest.raises(DistributedSetupError, match="no CUDA device"):
        select_device_index(0, 1, "", 0)


def test_choose_backend() -> None:
    assert choose_backend("auto", cuda=True) == "nccl"
    assert choose_backend("auto", cuda=False) == "gloo"
    assert choose_backend("gloo", cuda=True) == "gloo"
    assert choose_backend("nccl", cuda=True) == "nccl"
    with pytest.raises(DistributedSetupError, match="'nccl' but this job runs on CPUs"):
        choose_backend("nccl", cuda=False)


def test_plan_two_nodes_of_four_gpus() -> None:
    spec = make_spec(resources={"nodes": 2, "gpus_per_node": 4})
    plans = plan_ranks(spec)
    assert [p.rank for p in plans] == list(range(8))
    assert [p.node for p in plans] == ["node0"] * 4 + ["node1"] * 4
    assert [p.device for p in plans] == [f"cuda:{i}" for i in range(4)] * 2
    assert {p.backend for p in plans} == {"nccl"}
    assert {p.master for p in plans} == {f"node0:{DERIVED_PORT_TEXT}"}


def test_plan_with_real_hostnames_and_an_explicit_port() -> None:
    spec = make_spec(
        resources={"nodes": 2, "gpus_per_node": 0, "tasks_per_node": 2}, distributed={"master_port": 23456}
    )
    plans = plan_ranks(spec, ["n1", "n2"])
    assert [(p.rank, p.local_rank, p.node, p.device) for p in plans] == [
        (0, 0, "n1", "cpu"),
        (1, 1, "n1", "cpu"),
        (2, 0, "n2", "cpu"),
        (3, 1, "n2", "cpu"),
    ]
    assert {p.master for p in plans} == {"n1:23456"}
    assert {p.backend for p in plans} == {"gloo"}


def test_plan_single_task_has_no_process_group() -> None:
    (plan,) = plan_ranks(make_spec(resources={"gpus_per_node": 1}))
    assert (plan.device, plan.backend, plan.master) == ("cuda:0", None, "-")


def test_plan_rejects_wrong_hostname_count_and_impossible_layouts() -> None:
    with pytest.raises(DistributedSetupError, match="1 hostnames given for a 2-node job"):
        plan_ranks(make_spec(resources={"nodes": 2}), ["n1"])
    with pytest.raises(DistributedSetupError, match="no GPU of its own"):
        plan_ranks(make_spec(resources={"gpus_per_node": 2, "tasks_per_node": 4}))


def test_render_rank_table() -> None:
    table = render_rank_table(plan_ranks(make_spec(resources={"nodes": 2, "gpus_per_node": 2})))
    lines = table.splitlines()
    assert lines[0].split() == ["rank", "local", "node", "device", "backend", "master"]
    assert lines[4].split()[:5] == ["3", "1", "node1", "cuda:1", "nccl"]
    assert lines[4].endswith(f"node0:{DERIVED_PORT_TEXT}")


def test_render_rank_table_elides_the_middle_of_long_plans() -> None:
    plans = plan_ranks(make_spec(resources={"nodes": 64, "gpus_per_node": 8}))
    lines = render_rank_table(plans, max_rows=8).splitlines()
    assert len(lines) == 1 + 8 + 1
    assert "(504 more ranks)" in lines[5]
    assert lines[-1].split()[0] == "511"


# -- a local run's GPUs: a subset of the user's own CUDA_VISIBLE_DEVICES -------------------------------------------
UUID = "GPU-6a1b2c3d-0000-1111-2222-333344445555"


@pytest.mark.parametrize(
    ("visible", "count", "expected"),
    [
        (None, 2, "0,1"),  # unset: the machine's GPUs are the user's
        ("3", 1, "3"),  # GPU 3, not GPU 0
        (f"{UUID},3", 1, UUID),  # a UUID, kept as written
        (f" {UUID} , MIG-abc ,7", 3, f"{UUID},MIG-abc,7"),
        ("5,4,3,2", 2, "5,4"),  # the first ones, in the user's order
        ("3,-1,2", 1, "3"),  # CUDA reads up to the first invalid entry
        ("", 0, ""),  # a CPU job sees no GPU
        ("0,1", 0, ""),
    ],
)
def test_local_visible_devices_keep_the_users_choice(visible: str | None, count: int, expected: str) -> None:
    assert local_visible_devices(visible, count) == expected


@pytest.mark.parametrize(("visible", "found"), [("3", 1), ("", 0), ("3,-1,2", 1), ("NoDevFiles", 0)])
def test_fewer_visible_gpus_than_asked_is_refused(visible: str, found: int) -> None:
    with pytest.raises(UsageError) as caught:
        local_visible_devices(visible, 2)
    assert f"makes only {found} visible" in caught.value.message and "asks for 2 GPUs" in caught.value.message


LOCAL_GPU_SPEC = """\
name: gpus
cluster: local
resources: {nodes: 1, gpus_per_node: 2, tasks_per_node: 1}
entrypoint: hpctrain.examples.allreduce_check:main
"""


def test_a_local_runs_tasks_see_the_users_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real local executor's controller starts its task with the user's devices (the task prints them)."""
    from hpctrain.jobspec.load import load_job
    from hpctrain.launch.dry_run import dry_run
    from hpctrain.launch.submission import build_executor

    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUID},3,1")
    (tmp_path / "gpus.yaml").write_text(LOCAL_GPU_SPEC)
    job = load_job(tmp_path / "gpus.yaml")
    assert f"# GPUs: the tasks see CUDA_VISIBLE_DEVICES={UUID},3\n" in dry_run(job).text
    executor = build_executor(job, "local", tmp_path / "run")
    executor.run_dir = tmp_path / "run"  # type: ignore[attr-defined]  # as _launch sets it per trial
    started = executor._submit_command(f"{sys.executable} -c 'import os; print(os.environ[\"CUDA_VISIBLE_DEVICES\"])'")  # type: ignore[attr-defined]
    assert started._process.wait(timeout=60) == 0
    [log] = (tmp_path / "run" / "submitit").glob("*_0_log.out")
    assert log.read_text().strip() == f"{UUID},3"


def test_submit_local_refuses_fewer_gpus_than_asked_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpctrain.cli.main import main

    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpus.yaml").write_text(LOCAL_GPU_SPEC + f"output_dir: {tmp_path / 'runs'}\n")
    assert main(["submit", str(tmp_path / "gpus.yaml"), "--no-preflight"]) == 2
    err = capsys.readouterr().err
    assert "asks for 2 GPUs on this machine, but CUDA_VISIBLE_DEVICES='3' makes only 1 visible" in err
    assert not list((tmp_path / "runs").glob("*/*"))  # no run directory left behind
