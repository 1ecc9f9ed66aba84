"""Several ranks of a local test, forked from one process that has imported torch once.

``torch.multiprocessing.spawn`` starts every rank as a new interpreter, and each pays torch's,
torchvision's and the trainer's import again (~3 s of CPU on the 2-core CI machine: most of a short
test's ranks' time, hundreds of ranks over the local tier). Here the ranks are forked from
multiprocessing's fork server, which imports :data:`PRELOAD` once per pytest session and never runs
test code: each rank starts as a freshly imported process would, without the import.

What a fork server's child would not get by itself is the parent's *current* environment and
working directory (it inherits the server's, fixed when the server started): both are handed to
each rank and set before the rank's function runs. A module that reads the environment when it is
imported reads the server's: the preloaded ones must not depend on a test's environment.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

PRELOAD = ["torch", "torch.distributed", "torchvision", "hpctrain.trainer.trainer"]


def start_ranks(fn: Callable[..., Any], args: tuple[Any, ...], nprocs: int, *, timeout_s: float | None = None) -> None:
    """``fn(rank, *args)`` in ``nprocs`` forked ranks; returns when all ended, raises as ``mp.spawn`` does.

    With ``timeout_s``, ranks still running after it are killed and an AssertionError says so."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # takes effect at the server's start
    context = mp.start_processes(
        _in_callers_environment,
        args=(fn, dict(os.environ), os.getcwd(), args),
        nprocs=nprocs,
        join=False,
        start_method="forkserver",
    )
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not context.join(None if deadline is None else max(0.1, deadline - time.monotonic())):
        if deadline is not None and time.monotonic() >= deadline:
            running = [rank for rank, process in enumerate(context.processes) if process.is_alive()]
            for process in context.processes:
                process.kill()
            raise AssertionError(f"ranks {running} still running after {timeout_s} s")


def _in_callers_environment(
    rank: int, fn: Callable[..., Any], environ: dict[str, str], cwd: str, args: tuple[Any, ...]
) -> None:
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    fn(rank, *args)
