"""A data-loader worker's garbage collector never walks the objects it inherited from its rank.

Walking them copies nearly every page of the rank's heap into the worker (copy-on-write): seconds per
worker under load, at the first validation on every rank at once (CI 48's "no progress in phase
validation at step 2" on every rank of a 2-node job).
"""

from __future__ import annotations

import gc
import multiprocessing

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.runtime.worker_fork import frozen_heap
from hpctrain.task import data as task_data
from hpctrain.trainer.data import seed_worker
from hpctrain.trainer.data.loader_workers import ForkedLoader
from tests.task_fakes import as_rank

pytestmark = pytest.mark.local_dist


class CollectorView(Dataset):
    """Each sample: how many objects the worker's collector tracks, and how many it can never visit."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([len(gc.get_objects()), gc.get_freeze_count()])


def worker_view(loader_type: type[DataLoader]) -> tuple[int, int]:
    loader = loader_type(CollectorView(), batch_size=1, num_workers=1, worker_init_fn=seed_worker)
    tracked, frozen = next(iter(loader))[0].tolist()
    return tracked, frozen


def test_workers_start_with_the_inherited_heap_frozen() -> None:
    inherited = len(gc.get_objects())  # torch and the test session: a rank's heap in small
    tracked, frozen = worker_view(ForkedLoader)
    assert frozen >= inherited * 0.9 and tracked < inherited / 5
    assert gc.get_freeze_count() == 0  # the rank itself collects as before


def test_the_task_api_s_workers_start_with_the_inherited_heap_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    as_rank(monkeypatch)
    inherited = len(gc.get_objects())
    loader = task_data.ElasticLoader(CollectorView(), 1, shuffle=False, seeded_samples=False, num_workers=1)
    steps = loader.steps(0, 1)
    _, [batch] = next(steps)
    steps.close()
    tracked, frozen = batch[0].tolist()
    assert frozen >= inherited * 0.9 and tracked < inherited / 5
    assert gc.get_freeze_count() == 0


def test_a_plain_loader_worker_would_walk_it_all() -> None:
    """What ForkedLoader changes: a plain DataLoader's worker tracks everything it inherited."""
    inherited = len(gc.get_objects())
    tracked, frozen = worker_view(DataLoader)
    assert frozen == 0 and tracked >= inherited * 0.9


def collector_visits(obj: object) -> bool:
    """Whether the collector walks ``obj`` (frozen objects are in no generation)."""
    return any(tracked is obj for tracked in gc.get_objects())


def test_a_process_that_froze_its_heap_itself_keeps_it_frozen() -> None:
    # What the process froze stays frozen. (Not a comparison of freeze counts: an object frozen before
    # the block and freed during it, by any thread of the process, leaves the count lower.)
    chosen = [object()]
    assert collector_visits(chosen)
    gc.freeze()
    try:
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > 0 and not collector_visits(chosen)
    finally:
        gc.unfreeze()
    with frozen_heap():
        assert not collector_visits(chosen)
    assert gc.get_freeze_count() == 0 and collector_visits(chosen)


def test_workers_are_forked_whatever_the_interpreter_s_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The frozen heap, the held signals and the rank as the workers' parent hold only for a fork: a rank whose
    default start method is spawn (started by spawn; forkserver is Python 3.14's default) still forks them."""
    monkeypatch.setattr(
        multiprocessing.context._default_context, "_actual_context", multiprocessing.get_context("spawn")
    )
    assert multiprocessing.get_start_method() == "spawn"
    loader = ForkedLoader(list(range(4)), batch_size=2, num_workers=1)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert ForkedLoader(list(range(4)), batch_size=2).multiprocessing_context is None  # no workers: nothing to start
