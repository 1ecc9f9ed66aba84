"""What runs first in every data-loader worker: its seeds, which SIGTERM it obeys, and its stacks on request."""

from __future__ import annotations

import os
import random
import signal
import threading

import numpy as np
import torch

from hpctrain.runtime.child_stacks import answer_stack_requests


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
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # never fatal, whichever thread gets it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit the mask

    def filter_sigterm() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                os._exit(0)

    threading.Thread(target=filter_sigterm, name="sigterm-filter", daemon=True).start()
