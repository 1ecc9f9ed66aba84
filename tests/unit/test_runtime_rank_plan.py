"""The dry-run rank table and the two decisions it shares with the compute nodes."""

from __future__ import annotations

from typing import Any

import pytest

from hpctrain.errors import DistributedSetupError
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.rank_plan import (
    DERIVED_PORT_TEXT,
    choose_backend,
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
