"""A rank's data-loader workers' Python stacks, on the hang watchdog's request.

The hang watchdog (``runtime/hang.py``) dumps its own rank's threads, but a
rank waiting for its next batch shows only the wait: the stuck code is in a
worker, another process. So each worker answers :data:`STACKS_SIGNAL` by
writing every one of its threads' stacks to its stderr (the task's log), with
``faulthandler``: it works while the worker's threads are stuck, even on a
lock, and the worker goes on.

Only a child that answers the signal is sent it (its ``SigCgt`` mask in
``/proc`` says it catches it) and is a torch data-loader worker (torch names
the worker's thread ``pt_data_worker``): for any other process SIGQUIT's
default is to end it. Linux only, like the rest of the task side; elsewhere
no child is found. Torch-free.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

STACKS_SIGNAL = signal.SIGQUIT
WORKER_NAME = "pt_data_worker"  # torch's name for a data-loader worker's thread (its /proc comm)
PROC = Path("/proc")
STDERR_FD = 2  # the task's stderr log, whatever sys.stderr has become
WORKER_GAP_S = 1.0  # between two workers' dumps: each is a few writes of a few KB, done in well under this


def answer_stack_requests() -> None:
    """In a data-loader worker: :data:`STACKS_SIGNAL` writes every thread's stack to stderr and changes nothing else."""
    faulthandler.register(STACKS_SIGNAL, file=STDERR_FD, all_threads=True, chain=False)


def catches(status: str, signum: int) -> bool:
    """Whether a ``/proc/PID/status`` text says the process has a handler for ``signum`` (``SigCgt``). Pure."""
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            try:
                return bool(int(line.split(":", 1)[1].strip(), 16) >> (signum - 1) & 1)
            except ValueError:
                return False
    return False


def child_pids(pid: int, proc: Path = PROC) -> list[int]:
    """``pid``'s children (every thread's), in ``/proc``'s order; [] where ``/proc`` cannot say."""
    found: list[int] = []
    try:
        tasks = sorted((proc / str(pid) / "task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            words = (task / "children").read_text().split()
        except OSError:
            continue
        found.extend(int(w) for w in words if w.isdigit() and int(w) not in found)
    return found


def answering_workers(pid: int, proc: Path = PROC) -> list[int]:
    """``pid``'s data-loader workers that answer :data:`STACKS_SIGNAL` (see the module's docstring)."""
    workers = []
    for child in child_pids(pid, proc):
        try:
            name = (proc / str(child) / "comm").read_text().strip()
            status = (proc / str(child) / "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        if name == WORKER_NAME and catches(status, STACKS_SIGNAL):
            workers.append(child)
    return workers


def worker_header(worker: int, rank_pid: int) -> str:
    """The line before a worker's stacks in the task's log. Pure.

    A forked worker's stack ends in its rank's frames as they were at the fork
    (``iter(loader)`` -> ``Process.start`` -> ``popen_fork``): read under
    ``_bootstrap``, they look like the rank stuck in ``fork()``. They are the
    worker's own copy; where the rank is now is in its ``stacks/rank-NNNNN.txt``.
    """
    return (
        f"hpctrain: data-loader worker {worker} of pid {rank_pid}: its stacks follow (the frames below "
        "multiprocessing's _bootstrap are where its rank forked it, not where the rank is now)\n"
    )


def ask_workers_for_stacks(
    pid: int | None = None,
    proc: Path = PROC,
    *,
    gap_s: float = WORKER_GAP_S,
    sleep: Callable[[float], None] = time.sleep,
    kill: Callable[[int, int], None] = os.kill,
) -> list[int]:
    """Ask this process's (or ``pid``'s) data-loader workers to write their stacks to stderr; the pids asked.

    One at a time, each after a header line naming it, ``gap_s`` apart: several workers that write
    at once interleave their lines in the one log (the train loader's and the val loader's, seen in
    a hung validation) until neither stack can be read.
    """
    rank_pid = os.getpid() if pid is None else pid
    asked: list[int] = []
    for worker in answering_workers(rank_pid, proc):
        if asked:
            sleep(gap_s)
        _write_stderr(worker_header(worker, rank_pid))
        try:
            kill(worker, STACKS_SIGNAL)
        except OSError:  # it ended meanwhile
            continue
        asked.append(worker)
    return asked


def _write_stderr(text: str) -> None:
    try:
        os.write(STDERR_FD, text.encode())
    except OSError:
        pass
