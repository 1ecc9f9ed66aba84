"""How the trainer's data-loader worker starts: forked from a frozen heap with the stop signals held
(``runtime/worker_fork.py``), then its seeds, which SIGTERM it obeys, and its stacks on request."""

from __future__ import annotations

import random
import signal
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from hpctrain.runtime import stop_signals
from hpctrain.runtime.child_stacks import answer_stack_requests
from hpctrain.runtime.worker_fork import forking_workers


class ForkedLoader(DataLoader):
    """A DataLoader whose workers are forked from a frozen heap with the stop signals held
    (``runtime/worker_fork.py`` says why). ``worker_init_fn`` must be :func:`seed_worker` (or end in
    :func:`obey_only_parent_sigterm`); SIGUSR1/2 stay held in the worker.

    Forked by name (``multiprocessing_context="fork"``), not by the interpreter's default: what the
    workers rely on -- the frozen heap, the held signals, a parent that is the rank (the SIGTERM filter,
    the hang watchdog's request for stacks) -- holds only for a fork, and Python 3.14 makes
    ``forkserver`` the default on Linux (a rank started by ``spawn`` has ``spawn`` as its default already).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0) > 0:
            kwargs.setdefault("multiprocessing_context", "fork")
        super().__init__(*args, **kwargs)

    def __iter__(self) -> Any:
        with forking_workers(self.num_workers):  # the first iterator forks the workers; later ones reuse them
            return super().__iter__()


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
