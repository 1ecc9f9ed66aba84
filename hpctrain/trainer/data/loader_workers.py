"""How a data-loader worker starts: forked from a frozen heap, then its seeds, which SIGTERM it obeys, and
its stacks on request."""

from __future__ import annotations

import contextlib
import gc
import random
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from hpctrain.runtime import stop_signals
from hpctrain.runtime.child_stacks import answer_stack_requests


class ForkedLoader(DataLoader):
    """A DataLoader whose forked workers never walk the objects they inherit from their rank.

    A worker starts as a copy of its rank: ~350,000 Python objects (torch, torchvision, the model).
    Its first full garbage collection, which may come as early as the imports of torch's worker
    loop, visits every one of them and writes to each one's GC header: copy-on-write then copies
    nearly every page of the rank's heap into the worker. Measured on the 2-core test machine at a
    load of 20: 4.6 s for that one collection in a child forked from a rank (0.00 s with the heap
    frozen). At the first validation every rank forks its val workers at once, each rank waits in
    the next collective for the slowest, and no batch beats the hang watchdog meanwhile (the likely
    cause of CI 48's "no progress in phase validation at step 2" on every rank of a 2-node job; a
    val worker seen 15 s into its start, in that collection, in a local 2-rank loop under load).

    ``gc.freeze()`` before the fork (Python's own advice for fork without exec) moves what exists
    to a permanent generation that the child's collector never visits; the rank unfreezes right
    after its workers exist, so its own collections are as before.

    The workers are forked with the stop signals held (``runtime/stop_signals.held``): under
    ``proctrack/linuxproc`` a cancel's SIGTERM reaches every process of the task, a worker forked
    a moment before too, and one that got it before its ``worker_init_fn`` had set up
    :func:`obey_only_parent_sigterm` died of it (the rank then failed instead of saving its stop
    checkpoint: CI 49's cancel at the first validation, whose workers were just forked). Held, it
    waits for the worker's filter, which drops it. ``worker_init_fn`` must be :func:`seed_worker`
    (or end in :func:`obey_only_parent_sigterm`); SIGUSR1/2 stay held in the worker.
    """

    def __iter__(self) -> Any:
        if self.num_workers == 0:
            return super().__iter__()
        # the first iterator forks the workers; later ones (persistent) reuse them
        with frozen_heap(), stop_signals.held():
            return super().__iter__()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Every Python object that exists now, out of the collector's reach until the block ends (unless the
    process had frozen some itself: then they all stay frozen, as it chose)."""
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


def seed_worker(worker_id: int) -> None:
    """Seed Python and NumPy from the per-worker torch seed the DataLoader chose; keep Slurm's SIGTERM out;
    answer the hang watchdog's request for stacks."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
    answer_stack_requests()
    obey_only_parent_sigterm()


def obey_only_parent_sigterm() -> None:
    """In a data-loader worker: exit on the parent's SIGTERM, as torch does, and ignore anyone else's.

    Slurm's proctrack/linuxproc (and pgid) sends a job's SIGTERM (scancel,
    ``hpctrain cancel``, preemption, time limit) to every process of a task,
    workers included. torch's worker handler dies of a SIGTERM its parent did
    not send, and the main process then raises "DataLoader worker ... is
    killed by signal: Terminated" wherever it is, before it can save its stop
    checkpoint. The main process decides when its workers end: it shuts them
    down (terminating a slow one), or they exit when it is gone.
    """
    stop_signals.obey_only_parent({signal.SIGTERM})
