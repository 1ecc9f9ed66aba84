"""How a rank forks its data-loader workers: from a frozen heap, with the stop signals held.

Both loaders of the house fork through :func:`forking_workers` (the trainer's
``trainer/data/loader_workers.ForkedLoader``, the task API's ``task/data.ElasticLoader``):

* **a frozen heap.** A worker starts as a copy of its rank: ~350,000 Python objects (torch,
  torchvision, the model). Its first full garbage collection, which may come as early as the
  imports of torch's worker loop, visits every one of them and writes to each one's GC header:
  copy-on-write then copies nearly every page of the rank's heap into the worker. Measured on the
  2-core test machine at a load of 20: 4.6 s for that one collection in a child forked from a rank
  (0.00 s with the heap frozen). At the first validation every rank forks its val workers at once,
  each rank waits in the next collective for the slowest, and no batch beats the hang watchdog
  meanwhile (the likely cause of CI 48's "no progress in phase validation at step 2" on every rank
  of a 2-node job). ``gc.freeze()`` before the fork (Python's own advice for fork without exec)
  moves what exists to a permanent generation that the child's collector never visits; the rank
  unfreezes right after its workers exist, so its own collections are as before.
* **the stop signals held** (``stop_signals.held``). Under ``proctrack/linuxproc`` a cancel's
  SIGTERM reaches every process of the task, a worker forked a moment before too, and one that got
  it before its ``worker_init_fn`` had set up its handling died of it (the rank then failed instead
  of saving its stop checkpoint: CI 49's cancel at the first validation). Held, the signal waits
  for the worker's ``stop_signals.obey_only_parent``, which judges it. The workers' init function
  must install that handling (the trainer's ``seed_worker``, the task API's ``worker_init``).

* **stacks from the first instruction** (``child_stacks.answering_from_fork``): a worker answers
  the hang watchdog's request for stacks from the fork on, not only from its init function, so a
  worker stuck in between is not invisible.

Standard library only.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from hpctrain.runtime.child_stacks import answering_from_fork
from hpctrain.runtime.stop_signals import held


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


@contextlib.contextmanager
def forking_workers(num_workers: int) -> Iterator[None]:
    """Around the call that forks a loader's workers (``iter(loader)``): a frozen heap, the stop signals held,
    the children answering requests for stacks from the fork on; nothing for a loader without workers
    (``num_workers`` 0: nothing is forked)."""
    if num_workers == 0:
        yield
        return
    with frozen_heap(), held(), answering_from_fork():
        yield
