"""Every non-tensor field of a trainer checkpoint judged against the run (trainer/state.py check_fields,
recorded_micro_batches, state_budget); the resumes that act on it: tests/local/test_resume_checks.py."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from hpctrain.errors import CheckpointError
from hpctrain.trainer.state import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    RunShape,
    check_fields,
    recorded_micro_batches,
    state_budget,
)

# 2 ranks of 8 images, 10 steps per epoch, 3 epochs; stopped at step 4 of epoch 2 (global step 14).
RUN = RunShape(epochs=3, per_process=8, processes=2, strategy="ddp", micro_batches=2, steps_per_epoch=10)
GOOD: dict[str, Any] = {
    "format": CHECKPOINT_FORMAT,
    "format_version": CHECKPOINT_VERSION,
    "world_size": 2,
    "batch_size": 8,
    "micro_batches": 2,
    "progress": {"epoch": 1, "step_in_epoch": 4, "global_step": 14, "epochs_completed": 1, "val_top1": 40.0},
    "sampler": {"epoch": 1, "consumed_samples": 64, "seed": 0, "num_replicas": 2},
    "scheduler": {"last_epoch": 14},
    "epoch_sums": torch.zeros(4, dtype=torch.float64, device="meta"),
}
META = {"global_step": 14}


def with_field(dotted: str, value: Any) -> dict[str, Any]:
    state = copy.deepcopy(GOOD)
    *parents, last = dotted.split(".")
    node = state
    for key in parents:
        node = node[key]
    node[last] = value
    return state


def test_a_checkpoint_of_this_run_passes_before_and_after_the_data_is_built() -> None:
    check_fields(GOOD, META, RUN)
    check_fields(GOOD, META, RunShape(epochs=3, per_process=8, processes=2, strategy="ddp", micro_batches=None))
    finished = with_field("progress.epoch", 3) | {"sampler": {"epoch": 3, "consumed_samples": 0}}
    finished["progress"].update(step_in_epoch=0, epochs_completed=3, global_step=30)
    check_fields(finished, {"global_step": 30}, RUN)  # a completed run's last checkpoint
    check_fields({"format": "someone-else", "progress": "anything"}, None, RUN)  # restore_parts refuses it


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("world_size", "four", "world_size is 'four', not a whole number"),
        ("world_size", 0, "world_size is 0; a checkpoint of this run has from 1 to"),
        ("batch_size", 4096, "batch_size is 4096, but this run's processes load 8"),
        ("micro_batches", 1000, "micro_batches is 1000, but this run's global batch is 2 micro-batches of 8"),
        ("micro_batches", True, "micro_batches is True, not a whole number"),
        ("progress", [1, 2], "progress is a list, not the run's position"),
        ("progress.epoch", 10**9, "progress.epoch is 1000000000; a checkpoint of this run has from 0 to 3"),
        ("progress.epochs_completed", 10**9, "progress.epochs_completed is 1000000000"),
        ("progress.epoch", -1, "progress.epoch is -1"),
        ("progress.step_in_epoch", 11, "progress.step_in_epoch is 11; a checkpoint of this run has from 0 to 10"),
        ("progress.global_step", 15, "progress.global_step is 15, but its folder was saved at step 14"),
        ("progress.val_top1", 250.0, "progress.val_top1 is 250.0, outside what a run can measure"),
        ("progress.train_loss", math.inf, "progress.train_loss is inf, not a finite number"),
        ("progress.data_wait_fraction", 2.0, "progress.data_wait_fraction is 2.0, outside"),
        ("sampler.epoch", 7, "sampler.epoch is 7; a checkpoint of this run has from 1 to 1 (progress.epoch is 1)"),
        (
            "sampler.consumed_samples",
            10**6,
            "sampler.consumed_samples is 1000000, but progress.step_in_epoch 4 means 64",
        ),
        ("sampler.consumed_samples", "64", "sampler.consumed_samples is '64', not a whole number"),
        ("sampler", "pos", "sampler is a str, not a position"),
        ("scheduler.last_epoch", 10**9, "scheduler.last_epoch is 1000000000"),
        ("epoch_sums", torch.zeros(10**6, device="meta"), "epoch_sums holds 1000000 values, not 4"),
    ],
)
def test_a_field_that_cannot_be_this_runs_is_named(field: str, value: Any, said: str) -> None:
    with pytest.raises(CheckpointError) as caught:
        check_fields(with_field(field, value), META, RUN)
    assert said in caught.value.message


def test_global_step_beyond_the_epochs_so_far_is_refused() -> None:
    state = with_field("progress.global_step", 10**6)
    with pytest.raises(CheckpointError, match="more than 20 \\(2 epochs of 10 steps\\)"):
        check_fields(state, {"global_step": 10**6}, RUN)


def test_without_a_record_accumulation_is_bounded() -> None:
    unknown = RunShape(epochs=3, per_process=8, processes=2, strategy="ddp", micro_batches=None)
    check_fields(with_field("micro_batches", 8), META, unknown)  # an elastic resume on fewer ranks
    with pytest.raises(CheckpointError, match="1000-way accumulation per rank"):
        check_fields(with_field("micro_batches", 2000), META, unknown)
    check_fields(with_field("micro_batches", 3), META, unknown)  # uneven shares: 3 micro-batches on 2 ranks
    with pytest.raises(CheckpointError, match="micro_batches is 1: .* too few for 2 ranks"):
        check_fields(with_field("micro_batches", 1), META, unknown)
    hogwild = RunShape(epochs=3, per_process=8, processes=2, strategy="hogwild", micro_batches=None)
    with pytest.raises(CheckpointError, match="cannot resume on another shape"):
        check_fields(with_field("micro_batches", 4), META, hogwild)


def test_a_heal_onto_a_count_that_does_not_divide_the_batch_passes() -> None:
    """3 nodes x 2 ranks lost one: 6 micro-batches on 4 ranks (told by the supervisor), stopped mid-epoch."""
    healed = RunShape(epochs=3, per_process=8, processes=4, strategy="ddp", micro_batches=6, steps_per_epoch=10)
    state = with_field("micro_batches", 6) | {"world_size": 4}
    state["sampler"]["consumed_samples"] = 4 * 6 * 8
    check_fields(state, META, healed)
    state["sampler"]["consumed_samples"] = 4 * 4 * 8  # counted in this job's ranks, not the run's micro-batches
    with pytest.raises(CheckpointError, match="4 steps of 6 x 8 images"):
        check_fields(state, META, healed)


def test_the_runs_global_batch_on_record() -> None:
    assert recorded_micro_batches("6", {"global_batch_size": 256}, 8) == 6  # a step on fewer nodes is told
    assert recorded_micro_batches(None, {"global_batch_size": 256}, 8) == 32
    for info in ({"global_batch_size": 250}, {"global_batch_size": "256"}, {"global_batch_size": True}, {}, None):
        assert recorded_micro_batches(None, info, 8) is None


def test_the_budget_is_the_model_its_optimizer_state_and_the_ranks_rng() -> None:
    assert state_budget(100 << 20, optimizer_copies=1, world_size=4) == (400 << 20) + (64 << 20) + (4 << 20)
    assert state_budget(100 << 20, optimizer_copies=3, world_size=1) == (1000 << 20) + (64 << 20) + (1 << 20)


def test_evaluating_another_runs_checkpoint_judges_only_what_it_restores() -> None:
    """evaluate_only restores the model and progress alone: another run's layout and epochs are its own."""
    evaluate = RunShape(epochs=None, per_process=8, processes=1, strategy="single", micro_batches=None)
    evaluate = RunShape(**{**evaluate.__dict__, "evaluates_only": True})
    other = with_field("micro_batches", 6) | {"batch_size": 32, "world_size": 6}
    other["progress"].update(epoch=200, epochs_completed=200)
    check_fields(other, META, evaluate)
    with pytest.raises(CheckpointError, match="progress.val_top1 is nan"):
        check_fields(with_field("progress.val_top1", math.nan), META, evaluate)
