"""ElasticLoader: the trainer's elastic order for a user's dataset, positioned by the loop's step.

Ranks are simulated: each loader is built as rank r of R (its context patched),
so the global batch of a step is the union of what every rank's loader yields.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from hpctrain.errors import CheckpointError
from hpctrain.runtime import worker_fork
from hpctrain.task.data import ElasticLoader, accumulate
from tests.task_fakes import as_rank

N = 40


class Indexed(Dataset):
    """Sample i is (i, a random number drawn from every generator): order and seeding are both visible."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, float(torch.rand(())) + random.random() + float(np.random.rand())


def loaders(monkeypatch: pytest.MonkeyPatch, world: int, **kwargs: Any) -> list[ElasticLoader]:
    made = []
    for rank in range(world):
        as_rank(monkeypatch, rank, world)
        made.append(ElasticLoader(Indexed(), 2, **kwargs))
    return made


def global_batches(ranks: list[ElasticLoader], start: int, stop: int) -> dict[int, list[tuple[int, float]]]:
    """step -> every sample (index, draw) all ranks' loaders yield for it, sorted."""
    steps: dict[int, list[tuple[int, float]]] = {}
    for loader in ranks:
        for step, batches in loader.steps(start, stop):
            for indices, draws in batches:
                steps.setdefault(step, []).extend(zip(indices.tolist(), draws.tolist(), strict=True))
    return {step: sorted(samples) for step, samples in steps.items()}


def test_a_resume_at_any_step_on_fewer_ranks_yields_the_same_global_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    four = loaders(monkeypatch, 4)
    per_epoch = four[0].steps_per_epoch
    assert per_epoch == 5 and four[0].global_batch == 8  # 40 samples / (4 micro-batches of 2)
    full = global_batches(four, 0, 3 * per_epoch)
    assert len(full) == 15 and all(len(batch) == 8 for batch in full.values())
    assert full[0] != full[per_epoch]  # every epoch has its own order and draws

    two = loaders(monkeypatch, 2)
    for loader in two:
        loader.load_state_dict(four[0].state_dict())  # the run's 4 micro-batches per step, from its checkpoint
    assert (two[0].accumulation, two[0].steps_per_epoch) == (2, per_epoch)
    resumed = global_batches(two, 7, 3 * per_epoch)  # mid epoch 2, on 2 ranks
    assert resumed == {step: batch for step, batch in full.items() if step >= 7}


def test_seeded_samples_draw_the_same_whatever_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    [plain] = loaders(monkeypatch, 1)
    [workers] = loaders(monkeypatch, 1, num_workers=2)
    before = torch.get_rng_state()
    assert global_batches([plain], 3, 9) == global_batches([workers], 3, 9)
    assert torch.equal(torch.get_rng_state(), before)  # the loop's own generators are left alone


def test_another_dataset_or_batch_does_not_continue_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    [loader] = loaders(monkeypatch, 1)
    state = {**loader.state_dict(), "dataset_len": 41, "batch_size": 4}
    with pytest.raises(CheckpointError, match="batch_size 4 -> 2, dataset_len 41 -> 40"):
        loader.load_state_dict(state)
    three = loaders(monkeypatch, 3)
    with pytest.raises(CheckpointError, match="rank counts that can: 1, 2, 4"):
        three[0].load_state_dict({**loader.state_dict(), "micro_batches": 4})
    # a checkpoint is untrusted: a step no run of this loader could have taken is refused, not computed
    for crafted in (10**9, 0, True, "4", None):
        with pytest.raises(CheckpointError, match=f"micro_batches {crafted!r} is not a step"):
            loader.load_state_dict({**loader.state_dict(), "micro_batches": crafted})
    with pytest.raises(CheckpointError, match="state is a list, not a dict"):
        loader.load_state_dict([])  # type: ignore[arg-type]


class FakeDDP:
    def __init__(self) -> None:
        self.synced: list[bool] = []
        self._sync = True

    def no_sync(self) -> Any:
        owner = self

        class NoSync:
            def __enter__(self) -> None:
                owner._sync = False

            def __exit__(self, *exc: object) -> None:
                owner._sync = True

        return NoSync()


def test_accumulate_all_reduces_only_in_the_last_micro_batch() -> None:
    model = FakeDDP()
    for _ in accumulate(model, ["a", "b", "c"]):  # type: ignore[arg-type]
        model.synced.append(model._sync)
    assert model.synced == [False, False, True]


def test_a_loader_without_workers_forks_nothing_and_leaves_the_heap_and_signals_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def touched(what: str) -> Any:
        def fail() -> None:
            raise AssertionError(f"{what} by a loader with num_workers=0")

        return fail

    monkeypatch.setattr(worker_fork, "frozen_heap", touched("heap frozen"))
    monkeypatch.setattr(worker_fork, "held", touched("stop signals held"))
    as_rank(monkeypatch)
    loader = ElasticLoader(Indexed(), 2, shuffle=False, seeded_samples=False)
    assert [(step, [batch[0].tolist()]) for step, [batch] in loader.steps(0, 2)] == [(0, [[0, 1]]), (1, [[2, 3]])]


MARK = "imported"  # a forked worker sees what the rank set here; a spawned or forkserver one imports it afresh


class Marked(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> str:
        return MARK


def test_workers_are_forked_whatever_the_interpreters_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The held stop signals and the frozen heap are a fork's (runtime/worker_fork.py); Python 3.14 makes
    forkserver Linux's default: the loader asks for a fork by name. A user's explicit choice stands."""
    import multiprocessing

    globals()["MARK"] = "set by the rank"
    default = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        as_rank(monkeypatch)
        forked = ElasticLoader(Marked(), 2, shuffle=False, seeded_samples=False, num_workers=1)
        assert [batches[0] for _, batches in forked.steps(0, 1)] == [["set by the rank", "set by the rank"]]
        chosen = ElasticLoader(
            Marked(), 2, shuffle=False, seeded_samples=False, num_workers=1, multiprocessing_context="forkserver"
        )
        assert [batches[0] for _, batches in chosen.steps(0, 1)] == [["imported", "imported"]]
    finally:
        globals()["MARK"] = "imported"
        multiprocessing.set_start_method(default, force=True)
