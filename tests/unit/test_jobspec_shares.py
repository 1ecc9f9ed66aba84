"""How the ranks share a step's canonical micro-batches: whole ones, and pieces of those left over."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import pytest

from hpctrain.jobspec.shares import Part, SharePlan, describe_parts


def covered(plan: SharePlan, size: int) -> Counter[tuple[int, int]]:
    """(micro-batch, sample) -> how many ranks compute it, over every rank's parts of one step."""
    seen: Counter[tuple[int, int]] = Counter()
    for rank in range(plan.ranks):
        for part in plan.parts(rank, size):
            seen.update((part.micro_batch, sample) for sample in range(part.start, part.stop))
    return seen


@pytest.mark.parametrize("micro_batches", [1, 2, 3, 4, 6, 7, 16, 64])
@pytest.mark.parametrize("batch_size", [1, 2, 5, 32])
def test_every_sample_of_a_step_is_computed_exactly_once_on_any_rank_count(micro_batches: int, batch_size: int) -> None:
    for ranks in range(1, micro_batches + 1):
        plan = SharePlan(micro_batches, ranks, batch_size)
        for size in {batch_size, 1, max(1, batch_size // 3)}:  # a full step, and short last steps
            seen = covered(plan, size)
            assert set(seen) == {(j, i) for j in range(micro_batches) for i in range(size)}, (ranks, size)
            assert set(seen.values()) == {1}, (ranks, size)


@pytest.mark.parametrize(("micro_batches", "batch_size"), [(4, 3), (6, 2), (7, 5), (64, 32), (5, 1)])
def test_the_loss_divisors_weigh_every_sample_as_the_global_mean_does(micro_batches: int, batch_size: int) -> None:
    # A part's loss is the mean over its samples, divided by its divisor, and DDP averages over the W ranks:
    # each sample must weigh 1 / (M * n), as in the mean over the whole step of M micro-batches of n samples.
    for ranks in range(1, micro_batches + 1):
        plan = SharePlan(micro_batches, ranks, batch_size)
        for size in {batch_size, 1}:
            for rank in range(ranks):
                for part in plan.parts(rank, size):
                    divisor = Fraction(plan.loss_divisor(part)).limit_denominator(10**6)
                    assert 1 / (part.samples * divisor * ranks) == Fraction(1, micro_batches * size), (ranks, part)


def test_a_run_that_never_changed_shape_computes_its_own_micro_batch_whole() -> None:
    plan = SharePlan(4, 4, 8)
    assert [plan.parts(rank) for rank in range(4)] == [[Part(rank, 0, 8, 8)] for rank in range(4)]
    assert plan.groups == () and not plan.split and plan.step_cost() == 1.0
    assert plan.loss_divisor(Part(0, 0, 8, 8)) == 1


def test_ranks_that_divide_the_micro_batches_take_every_ranks_th_whole() -> None:
    plan = SharePlan(6, 2, 4)
    assert [[part.micro_batch for part in plan.parts(rank)] for rank in range(2)] == [[0, 2, 4], [1, 3, 5]]
    assert plan.groups == () and plan.step_cost() == 3.0
    assert plan.loss_divisor(Part(0, 0, 4, 4)) == 3  # today's 1 / (M / W), bit for bit


def test_three_nodes_of_two_on_two_nodes_split_two_micro_batches_in_halves() -> None:
    plan = SharePlan(6, 4, 2)  # the Slurm test: 3 x 2 ranks, one node lost
    assert plan.groups == ((0, 1), (2, 3)) and plan.split
    assert plan.parts(0) == [Part(4, 0, 1, 2, group=0), Part(0, 0, 2, 2)]
    assert plan.parts(3) == [Part(5, 1, 2, 2, group=1), Part(3, 0, 2, 2)]
    assert plan.loss_divisor(plan.parts(0)[0]) == 3.0 and plan.loss_divisor(plan.parts(0)[1]) == 1.5
    assert plan.step_cost() == 1.5  # 4 of 6 ranks: the ideal 1.5


def test_fifteen_of_sixteen_nodes_of_four_gpus_run_near_fifteen_sixteenths() -> None:
    plan = SharePlan(64, 60, 32)
    assert [len(group) for group in plan.groups] == [15, 15, 15, 15]
    assert all(len(plan.parts(rank)) == 2 for rank in range(60))  # one whole, one piece of 2 or 3 samples
    assert plan.step_cost() == pytest.approx(35 / 32)  # throughput 0.914 of 16 nodes'; the ideal is 0.9375
    assert SharePlan(64, 56, 32).step_cost() == 37 / 32  # 14 nodes: groups of 7, pieces of 4 or 5 (ideal 36.6)


def test_groups_never_hold_more_ranks_than_a_micro_batch_has_samples() -> None:
    plan = SharePlan(7, 6, 2)  # one left over, 6 ranks for it, but only 2 samples
    assert plan.groups == ((0, 1),)
    assert plan.parts(5) == [Part(5, 0, 2, 2)]  # ranks 2-5 compute their whole micro-batch only


def test_a_left_over_micro_batch_alone_in_its_group_is_computed_whole() -> None:
    plan = SharePlan(5, 3, 4)  # two left over, three ranks: groups of 2 and 1
    assert plan.groups == ((0, 1), (2,))
    assert plan.parts(2) == [Part(2, 0, 4, 4), Part(4, 0, 4, 4)]
    assert not SharePlan(5, 4, 4).split or SharePlan(5, 4, 4).groups == ((0, 1, 2, 3),)


def test_a_short_last_step_computes_a_left_over_micro_batch_whole_on_its_groups_first_rank() -> None:
    plan = SharePlan(4, 3, 5)  # the local test: pieces of 1, 2 and 2 samples in a full step
    assert [plan.parts(rank)[0] for rank in range(3)] == [
        Part(3, 0, 1, 5, group=0),
        Part(3, 1, 3, 5, group=0),
        Part(3, 3, 5, 5, group=0),
    ]
    assert plan.parts(0, 1) == [Part(0, 0, 1, 1), Part(3, 0, 1, 1)]  # 1 sample each: too few to split
    assert plan.parts(1, 1) == [Part(1, 0, 1, 1)]


def test_more_ranks_than_micro_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="5 ranks cannot share 4 micro-batches"):
        SharePlan(4, 5, 8)


def test_more_nodes_never_run_slower() -> None:
    for micro_batches, batch_size in [(64, 32), (48, 2), (12, 8)]:
        costs = [SharePlan(micro_batches, ranks, batch_size).step_cost() for ranks in range(1, micro_batches + 1)]
        assert costs == sorted(costs, reverse=True)


def test_parts_are_described_for_the_log() -> None:
    assert describe_parts(SharePlan(6, 2, 4).parts(0)) == "3 whole micro-batches"
    assert describe_parts(SharePlan(6, 4, 2).parts(1)) == "1 whole micro-batch and 1 of the 2 samples of micro-batch 4"
