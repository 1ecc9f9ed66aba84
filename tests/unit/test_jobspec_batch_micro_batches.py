"""Canonical micro-batches: each step's global batch is the same whatever the number of ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.contract.rundir import read_run_info, spec_path, submitit_dir
from hpctrain.errors import TrainingConfigError, UsageError
from hpctrain.jobspec.batch import micro_batch_positions, micro_batch_problem
from hpctrain.jobspec.load import load_job
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.node_loss import reshape_problem
from hpctrain.launch import submission
from hpctrain.launch.resume import reshaped
from hpctrain.trainer.data import MicroBatchSampler, ResumableDistributedSampler
from hpctrain.trainer.elastic import run_micro_batches


def test_micro_batch_j_is_todays_rank_j_batch() -> None:
    # Rank r of M computes global positions k*G + r + M*i (DistributedSampler's shard cut into batches).
    micro_batches, batch, length = 4, 3, 4 * 3 * 5
    for step in range(5):
        for j in range(micro_batches):
            expected = [step * micro_batches * batch + j + micro_batches * i for i in range(batch)]
            got = micro_batch_positions(step, j, micro_batches=micro_batches, batch_size=batch, length=length)
            assert list(got) == expected


def test_the_last_short_step_shortens_every_micro_batch_alike() -> None:
    sizes = [len(micro_batch_positions(1, j, micro_batches=4, batch_size=3, length=20)) for j in range(4)]
    assert sizes == [2, 2, 2, 2]  # 8 positions left after one step of 12


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("consumed_steps", [0, 1, 3])
@pytest.mark.parametrize("length", [45, 39])
def test_every_rank_count_trains_the_same_global_batches(ranks: int, consumed_steps: int, length: int) -> None:
    data, micro_batches, batch = range(length), 4, 3  # 45 pads to 48: 4 steps of 12; 39 to 40: the last of 4

    def steps(world: int) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for rank in range(world):
            sampler = ResumableDistributedSampler(data, world, rank, seed=5, batch_size=batch)
            sampler.set_micro_batches(micro_batches)
            sampler.set_epoch(2)
            sampler.set_start_batch(consumed_steps, batch)
            loader = list(MicroBatchSampler(sampler))
            parts = list(sampler.step_parts())
            assert len(loader) == len(MicroBatchSampler(sampler)) == sum(map(len, parts))
            assert len(parts) == sampler.steps_len() == 4 - consumed_steps
            assert len(sampler) == sum(map(len, loader))
            batches = iter(loader)
            for step, step_parts in enumerate(parts):
                for part in step_parts:
                    indices = next(batches)
                    assert len(indices) == part.samples
                    out.setdefault(consumed_steps + step, []).extend(indices)
        return {step: sorted(indices) for step, indices in out.items()}

    assert steps(ranks) == steps(micro_batches)  # the same samples, step by step


def test_one_micro_batch_per_rank_is_distributed_samplers_batches() -> None:
    sampler = ResumableDistributedSampler(range(23), 3, 1, seed=7, batch_size=2)
    shard = list(sampler)
    assert list(MicroBatchSampler(sampler)) == [shard[i : i + 2] for i in range(0, len(shard), 2)]


def test_every_rank_needs_a_micro_batch() -> None:
    sampler = ResumableDistributedSampler(range(10), 3, 0, batch_size=4)
    with pytest.raises(ValueError, match="2 micro-batches cannot be shared by 3 ranks"):
        sampler.set_micro_batches(2)
    sampler.set_micro_batches(4)  # 3 ranks: whole ones and pieces
    assert sampler.plan.groups == ((0, 1, 2),)


def test_the_problem_names_the_numbers_and_the_counts_that_work() -> None:
    assert micro_batch_problem(4, 4, strategy="ddp") is None
    assert micro_batch_problem(8, 2, strategy="ddp") is None
    assert micro_batch_problem(4, 3, strategy="ddp") is None  # uneven shares
    problem = micro_batch_problem(4, 5, strategy="ddp")
    assert problem is not None and "4 micro-batches" in problem and "5 ranks" in problem and "at most 4" in problem
    problem = micro_batch_problem(4, 2, strategy="dp")
    assert problem is not None and "trainer.strategy: dp cannot resume on another shape" in problem


def test_a_run_keeps_its_checkpoints_micro_batches() -> None:
    kwargs = {"world_size": 2, "strategy": "ddp", "source": Path("ck")}
    assert run_micro_batches(None, processes=2, **kwargs) == 2
    assert run_micro_batches({"micro_batches": 4, "world_size": 4}, processes=2, **kwargs) == 4
    assert run_micro_batches({"world_size": 4}, processes=2, **kwargs) == 4  # written before the record existed
    assert run_micro_batches({"world_size": 2}, processes=2, **kwargs) == 2
    assert run_micro_batches({"micro_batches": 3, "world_size": 3}, processes=2, **kwargs) == 3
    with pytest.raises(TrainingConfigError, match="ck: the run's global batch is 3 micro-batches") as caught:
        run_micro_batches({"micro_batches": 3, "world_size": 3}, processes=4, **{**kwargs, "world_size": 4})
    assert "at most 3 ranks" in (caught.value.hint or "")


def job(nodes: int, strategy: str = "ddp", gpus: int = 1) -> JobSpec:
    resources = {"nodes": nodes, "gpus_per_node": gpus}
    return JobSpec.model_validate({"name": "e", "resources": resources, "trainer": {"strategy": strategy}})


def test_resume_on_other_nodes_keeps_the_global_batch_or_says_which_counts_do() -> None:
    assert reshape_problem(job(4), job(2)) is None and reshape_problem(job(4), job(1)) is None
    assert reshape_problem(job(4), job(3)) is None
    problem = reshape_problem(job(4), job(5))
    assert problem is not None and problem.startswith("resources.nodes: 5:")
    assert "4 micro-batches" in problem and "node counts that keep it: 1 to 4" in problem
    problem = reshape_problem(job(4, "dp", gpus=2), job(2, "dp", gpus=2))
    assert problem is not None and "trainer.strategy: dp cannot resume on another shape" in problem


def test_resume_set_takes_only_resources_keys(tmp_path: Path) -> None:
    data = f"data: {{root: {tmp_path}}}\n"
    spec_path(tmp_path).write_text("name: e\nresources: {nodes: 4}\ntrainer: {strategy: ddp}\n" + data)
    loaded = load_job(spec_path(tmp_path))
    with pytest.raises(UsageError, match="--set trainer.epochs=3: resume changes only resources"):
        reshaped(tmp_path, loaded, ["trainer.epochs=3"])
    with pytest.raises(UsageError, match="resources.nodes: 5: .*node counts that keep it: 1 to 4"):
        reshaped(tmp_path, loaded, ["resources.nodes=5"])
    assert reshaped(tmp_path, loaded, ["resources.nodes=3"]).spec.resources.nodes == 3
    assert reshaped(tmp_path, loaded, ["resources.nodes=2"]).spec.resources.nodes == 2


def test_run_json_records_the_new_shape_and_keeps_the_first_global_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    spec_path(tmp_path).write_text(
        f"name: e\nresources: {{nodes: 4}}\ntrainer: {{strategy: ddp}}\ndata: {{root: {tmp_path}}}\n"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    first = load_job(spec_path(tmp_path))
    submission._record_submission(run_dir, first, "local", "11", submitit_dir(run_dir))
    submission._record_submission(run_dir, reshaped(tmp_path, first, ["resources.nodes=2"]), "local", "12", run_dir)
    info = read_run_info(run_dir)
    assert info["nodes"] == 2 and info["world_size"] == 2 and info["job_ids"] == ["11", "12"]
    assert info["global_batch_size"] == first.spec.global_batch_size == 4 * 256
