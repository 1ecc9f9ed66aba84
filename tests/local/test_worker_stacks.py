"""A data-loader worker stuck in its dataset answers the hang watchdog's request with its stacks.

The rank's own dump shows only its wait for the next batch; the stuck code is in the worker
(the first validation's hang under load, CI #48, left no trace of it).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from hpctrain.runtime.child_stacks import answering_workers, ask_workers_for_stacks
from hpctrain.task.data import worker_init as task_worker_init
from hpctrain.trainer.data import seed_worker
from hpctrain.trainer.data.loader_workers import ForkedLoader

pytestmark = pytest.mark.local_dist


class StuckImages(Dataset):
    def __init__(self) -> None:
        self.stuck = multiprocessing.Event()  # set in the (forked) worker as it enters the stuck code

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        self.stuck.set()
        return wait_for_a_lock_nobody_releases()


def wait_for_a_lock_nobody_releases() -> torch.Tensor:
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # a lock held at fork by a thread the child does not have
    raise AssertionError("unreachable")


def stacks_once_they_show(frame: str, worker: int, capfd: pytest.CaptureFixture[str]) -> str:
    """Once ``worker`` answers (a starved child, CI's nice 10, may not have registered yet), ask it for its
    stacks every 0.5 s until ``frame`` shows (at most a minute); what its dumps wrote to stderr."""
    deadline = time.monotonic() + 60
    while not answering_workers(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.05)
    seen = ""
    while frame not in seen and time.monotonic() < deadline:
        assert ask_workers_for_stacks() == [worker]
        time.sleep(0.5)
        seen += capfd.readouterr().err
    return seen


@pytest.mark.parametrize("init", [seed_worker, task_worker_init], ids=["trainer", "task-api"])
def test_a_stuck_worker_writes_its_stacks_to_stderr_on_request(
    capfd: pytest.CaptureFixture[str], init: Callable[[int], None]
) -> None:
    images = StuckImages()
    loader = DataLoader(images, batch_size=2, num_workers=1, worker_init_fn=init)
    batches = iter(loader)  # the worker starts and takes its first indices; next() would wait forever
    workers = list(batches._workers)  # type: ignore[attr-defined]
    try:
        # Asked only once the worker is in the stuck code: between its worker_init (it answers from there on)
        # and its first __getitem__ a starved worker (CI's nice 10) dumped stacks without the stuck frame.
        assert images.stuck.wait(timeout=60), "the worker never reached its dataset"
        # A dump is a snapshot: the event is set a moment before the worker blocks (its own Event.set() was once
        # the dumped frame), so the request is repeated until the stuck frame shows, as a watchdog's next one would.
        seen = stacks_once_they_show("wait_for_a_lock_nobody_releases", workers[0].pid, capfd)
        assert "wait_for_a_lock_nobody_releases" in seen and "__getitem__" in seen
        assert "filter_signals" in seen  # every thread, not only the stuck one (the SIGTERM filter)
        assert workers[0].is_alive()  # a request, not an end
    finally:
        for worker in workers:
            worker.terminate()  # the parent's SIGTERM: the worker exits (loader_workers.obey_only_parent_sigterm)
            worker.join(timeout=10)
        del batches


HELD_AT_FORK = threading.Lock()


def init_behind_a_lock_held_at_fork(worker_id: int) -> None:
    HELD_AT_FORK.acquire()  # held by the rank at the fork: the child waits forever, before seed_worker
    seed_worker(worker_id)


def test_a_worker_stuck_before_its_init_answers_too(capfd: pytest.CaptureFixture[str]) -> None:
    """A worker forked while a lock was held, stuck before its worker_init could register the handler, still
    writes its stacks (it answers from the fork on: runtime/worker_fork.forking_workers), where it was invisible."""
    loader = ForkedLoader(list(range(8)), batch_size=2, num_workers=1, worker_init_fn=init_behind_a_lock_held_at_fork)
    with HELD_AT_FORK:
        batches = iter(loader)
    workers = list(batches._workers)  # type: ignore[attr-defined]
    try:
        seen = stacks_once_they_show("init_behind_a_lock_held_at_fork", workers[0].pid, capfd)
        assert "init_behind_a_lock_held_at_fork" in seen and "_worker_loop" in seen
        assert f"data-loader worker {workers[0].pid} of pid {os.getpid()}" in seen
        assert workers[0].is_alive()
    finally:
        # Killed, not ended: torch's SIGCHLD handler would raise "worker ... is killed by signal" in this process
        # (the rehearsal's failure) unless the loader forgets its workers first, as its own shutdown does.
        torch.utils.data._utils.signal_handling._remove_worker_pids(id(batches))
        batches._worker_pids_set = False  # type: ignore[attr-defined]
        for worker in workers:
            worker.kill()  # its SIGTERM stays held: it never reached its handling
            worker.join(timeout=10)
        del batches
