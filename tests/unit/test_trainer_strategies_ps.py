"""strategy: ps without a process group: sharding, the spec's checks, and the server's rules for pushes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from hpctrain.errors import DistributedSetupError, SpecError, TrainingConfigError
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.runtime.context import TaskEnv
from hpctrain.trainer.strategies import build_strategy
from hpctrain.trainer.strategies.ps_server import ShardServer, shard_parameters

VALID = "name: job\ndata:\n  root: /datasets/imagenet\n"


pytestmark = pytest.mark.usefixtures("isolated")


def load(tmp_path: Path, text: str):  # noqa: ANN201
    path = tmp_path / "job.yaml"
    path.write_text(VALID + textwrap.dedent(text))
    return load_job(path)


def problems(tmp_path: Path, text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        load(tmp_path, text)
    return {p.key: p.message for p in info.value.problems}


# -- sharding -------------------------------------------------------------------------------------------------
def test_shards_balance_values_and_keep_whole_parameters() -> None:
    numels = [100, 1, 50, 50, 2, 97]
    owner = shard_parameters(numels, 2)
    loads = [sum(n for n, o in zip(numels, owner, strict=True) if o == s) for s in range(2)]
    assert sorted(loads) == [150, 150]
    assert shard_parameters(numels, 2) == owner  # a pure function: every rank computes the same shards


def test_one_server_owns_everything_and_more_servers_than_tensors_leave_some_empty() -> None:
    assert shard_parameters([3, 2, 1], 1) == [0, 0, 0]
    assert sorted(shard_parameters([3, 2], 4)) == [0, 1]
    with pytest.raises(ValueError, match="at least 1"):
        shard_parameters([1], 0)


def test_resnet_shards_are_balanced_by_numel() -> None:
    import torchvision

    numels = [p.numel() for p in torchvision.models.resnet18(num_classes=10).parameters()]
    owner = shard_parameters(numels, 3)
    loads = [sum(n for n, o in zip(numels, owner, strict=True) if o == s) for s in range(3)]
    assert max(loads) - min(loads) <= max(numels)  # greedy largest-first: within one tensor of even


# -- the spec -------------------------------------------------------------------------------------------------
def test_ps_defaults_and_global_batch_over_workers(tmp_path: Path) -> None:
    job = load(tmp_path, "resources: {nodes: 2, tasks_per_node: 2}\ntrainer: {strategy: ps, batch_size: 8}\n")
    ps = job.spec.trainer.ps
    assert (ps.servers, ps.mode, ps.max_staleness) == (1, "sync", None)
    assert job.spec.world_size == 4 and job.spec.global_batch_size == 24  # 3 workers x 8; the server loads none


def test_async_with_staleness_and_two_servers(tmp_path: Path) -> None:
    text = "resources: {tasks_per_node: 5}\ntrainer: {strategy: ps, ps: {servers: 2, mode: async, max_staleness: 3}}\n"
    job = load(tmp_path, text)
    assert job.spec.trainer.ps.max_staleness == 3 and job.spec.batch_layout.processes == 3


@pytest.mark.parametrize(
    ("text", "key", "needle"),
    [
        ("trainer: {strategy: ps}\n", "trainer.ps.servers", "no task is left to be a worker"),
        (
            "resources: {tasks_per_node: 2}\ntrainer: {strategy: ps, ps: {servers: 2}}\n",
            "trainer.ps.servers",
            "3 tasks",
        ),
        ("resources: {tasks_per_node: 2, gpus_per_node: 2}\ntrainer: {strategy: ps}\n", "trainer.strategy", "CPU"),
        ("resources: {tasks_per_node: 2}\ntrainer: {strategy: ps, precision: fp16}\n", "trainer.precision", "bf16"),
        (
            "resources: {tasks_per_node: 2}\ntrainer: {strategy: ps, ps: {max_staleness: 2}}\n",
            "trainer.ps.max_staleness",
            "mode: async",
        ),
        ("trainer: {strategy: ps, ps: {mode: hogwild}}\n", "trainer.ps.mode", "'sync' or 'async'"),
        ("trainer: {strategy: ps, ps: {servers: 0}}\n", "trainer.ps.servers", "greater than or equal to 1"),
        ("trainer: {strategy: ps, ps: {max_staleness: -1}}\n", "trainer.ps.max_staleness", "greater than or equal"),
        ("trainer: {strategy: ps, ps: {sever: 1}}\n", "trainer.ps.sever", "servers"),
    ],
)
def test_spec_problems_name_the_key(tmp_path: Path, text: str, key: str, needle: str) -> None:
    found = problems(tmp_path, text)
    assert key in found, found
    assert needle in found[key]


def env(rank: int, world: int) -> TaskEnv:
    return TaskEnv(rank, world, rank, world, 0, 1, ("n",), "127.0.0.1", 29500, "1", 0, "single")


def ps_spec(**ps: object) -> JobSpec:
    return JobSpec.model_validate({"name": "x", "trainer": {"strategy": "ps", "ps": ps}})


def test_strategy_refuses_a_job_without_workers_or_on_gpus() -> None:
    with pytest.raises(TrainingConfigError, match="leave no worker"):
        build_strategy(ps_spec(servers=2)).check(env(0, 2), torch.device("cpu"))
    with pytest.raises(TrainingConfigError, match="CPU tasks"):
        build_strategy(ps_spec()).check(env(0, 2), torch.device("cuda", 0))


def test_more_servers_than_parameter_tensors_is_refused() -> None:
    strategy = build_strategy(ps_spec(servers=3))
    with pytest.raises(TrainingConfigError, match="at most 2"):
        strategy.wrap(torch.nn.Linear(2, 2), torch.device("cpu"))


def test_workers_shard_the_train_set_among_themselves() -> None:
    strategy = build_strategy(ps_spec(servers=2))
    assert [strategy.train_shard(env(rank, 5)) for rank in range(5)] == [(0, 3), (0, 3), (0, 3), (1, 3), (2, 3)]


# -- the server's rules ---------------------------------------------------------------------------------------
def server(mode: str, workers: int, max_staleness: int | None = None) -> ShardServer:
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return ShardServer([param], optimizer, scheduler, workers=workers, mode=mode, max_staleness=max_staleness)


def test_sync_applies_the_mean_once_every_worker_pushed() -> None:
    shard = server("sync", 2)
    first = shard.push(0, 0, [torch.tensor([1.0, 2.0])], torch.tensor([1.0, 0.0, 0.5, 8.0]))
    assert not first.done() and shard.version == 0  # waits for the other worker
    second = shard.push(1, 0, [torch.tensor([3.0, 4.0])], None)
    version, values = first.wait()
    assert version == 1 and torch.equal(values[0], torch.tensor([-2.0, -3.0]))
    assert second.wait()[0] == 1 and torch.equal(second.wait()[1][0], values[0])
    assert shard.scheduler.last_epoch == 1
    assert shard.wait_round(1.0).tolist() == [1.0, 0.0, 0.5, 8.0]  # worker 0's sums, for the log


def test_async_applies_each_push_and_rejects_stale_ones() -> None:
    shard = server("async", 3, max_staleness=1)
    assert shard.push(0, 0, [torch.ones(2)], torch.zeros(4)).wait()[0] == 1
    assert shard.push(1, 0, [torch.ones(2)], None).wait()[0] == 2  # 1 update old: allowed
    version, values = shard.push(2, 0, [torch.ones(2)], None).wait()  # 2 updates old: rejected, gets fresh values
    assert (version, shard.rejected) == (2, 1)
    assert torch.equal(values[0], torch.full((2,), -2.0))
    assert shard.rounds == 1 and shard.scheduler.last_epoch == 1  # the schedule steps once a round


def test_a_server_waiting_for_pushes_gives_up_with_the_timeout() -> None:
    shard = server("sync", 2)
    shard.push(0, 0, [torch.ones(2)], torch.zeros(4))
    with pytest.raises(DistributedSetupError, match="1 of 2 pushed"):
        shard.wait_round(0.05)


def test_the_rpc_rendezvous_port_is_never_a_nearby_jobs_master_port() -> None:
    from hpctrain.runtime.master import PORT_RANGE_END, PORT_RANGE_START, derive_master_port, second_port

    assert second_port(29400, chosen=True) == 29401 and second_port(65535, chosen=True) == 65534
    assert second_port(40000, chosen=False) == 40001  # a MASTER_PORT outside the derived range: the one after it
    # A derived master port's RPC group is half the range away: never the next job id's master port (which a
    # job submitted just after it derives, and often on the same first node: rehearsal 25's collision).
    for job in (2303, 14499, 9_999_999):
        port = second_port(derive_master_port(str(job)), chosen=False)
        assert PORT_RANGE_START <= port < PORT_RANGE_END
        assert port not in {derive_master_port(str(job + d)) for d in range(-1000, 1001)}
