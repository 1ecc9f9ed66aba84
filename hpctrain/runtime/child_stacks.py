"""A rank's data-loader workers' Python stacks, on the hang watchdog's request.

The hang watchdog (``runtime/hang.py``) dumps its own rank's threads, but a
rank waiting for its next batch shows only the wait: the stuck code is in a
worker, another process. So each worker answers :data:`STACKS_SIGNAL` by
writing every one of its threads' stacks to its stderr (the task's log), with
``faulthandler``: it works while the worker's threads are stuck, even on a
lock, and the worker goes on.

A worker answers from its first Python instruction after the fork, not only
from its ``worker_init_fn``: a child forked inside :func:`answering_from_fork`
(``runtime/worker_fork.forking_workers``, around every loader's fork) registers
the handler in an at-fork hook. A worker stuck between the fork and its init
(a lock another thread of the rank held at the fork) would otherwise be
invisible: not asked, its rank waiting for its first batch with no word why.

Only a child that answers the signal is sent it (its ``SigCgt`` mask in
``/proc`` says it catches it) and is a torch data-loader worker (torch names
the worker's thread ``pt_data_worker``) or was forked inside
:func:`answering_from_fork`: for any other process SIGQUIT's default is to end
it. A worker that does not answer is described from ``/proc`` instead
(:func:`silent_workers`). Linux only, like the rest of the task side; elsewhere
no child is found. Torch-free.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STACKS_SIGNAL = signal.SIGQUIT
WORKER_NAME = "pt_data_worker"  # torch's name for a data-loader worker's thread (its /proc comm)
PROC = Path("/proc")
STDERR_FD = 2  # the task's stderr log, whatever sys.stderr has become
WORKER_GAP_S = 0.25  # between two workers' dumps (each a few writes of a few KB); 16 workers: ~4 s before the
# rank reports the hang, not 15 (the dumps interleaving under a starved machine costs only readability)


_arming = False  # inside answering_from_fork: a child forked now answers from its first instruction
_forked: set[int] = set()  # this process's children forked inside answering_from_fork (and still its children)


def answer_stack_requests() -> None:
    """In a data-loader worker: :data:`STACKS_SIGNAL` writes every thread's stack to stderr and changes nothing else."""
    faulthandler.register(STACKS_SIGNAL, file=STDERR_FD, all_threads=True, chain=False)


def _after_fork_in_child() -> None:
    global _arming
    _forked.clear()  # the parent's children are not this process's
    if _arming:
        _arming = False  # this child's own forks are not armed
        answer_stack_requests()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def answering_from_fork() -> Iterator[None]:
    """Around the call that forks data-loader workers: each child forked in the block answers
    :data:`STACKS_SIGNAL` from the fork on, and is asked for its stacks whatever its name."""
    global _arming
    before = set(child_pids(os.getpid()))
    _arming = True
    try:
        yield
    finally:
        _arming = False
        now = set(child_pids(os.getpid()))
        _forked.intersection_update(now)
        _forked.update(now - before)


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


def _loader_workers(pid: int, proc: Path) -> Iterator[tuple[int, str, str]]:
    """``pid``'s data-loader workers (torch's thread name, or forked inside :func:`answering_from_fork`), each
    as (pid, comm, ``/proc/PID/status`` text); one that ended meanwhile is passed over."""
    for child in child_pids(pid, proc):
        try:
            name = (proc / str(child) / "comm").read_text().strip()
            status = (proc / str(child) / "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        if name == WORKER_NAME or child in _forked:
            yield child, name, status


def answering_workers(pid: int, proc: Path = PROC) -> list[int]:
    """``pid``'s data-loader workers that answer :data:`STACKS_SIGNAL` (see the module's docstring)."""
    return [child for child, _, status in _loader_workers(pid, proc) if catches(status, STACKS_SIGNAL)]


def silent_workers(pid: int | None = None, proc: Path = PROC) -> list[str]:
    """``pid``'s data-loader workers that do not answer :data:`STACKS_SIGNAL`, each as ``PID (comm C, state S,
    waiting in W)`` from ``/proc``: a worker stuck before it could register (or whose rank forked it
    outside :func:`answering_from_fork`) still gets named, with where the kernel has it waiting."""
    found = []
    for child, name, status in _loader_workers(os.getpid() if pid is None else pid, proc):
        if catches(status, STACKS_SIGNAL):
            continue
        state = next((line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("State:")), "?")
        try:
            wchan = (proc / str(child) / "wchan").read_text().strip() or "-"
        except OSError:
            wchan = "?"
        found.append(f"{child} (comm {name}, state {state}, waiting in {wchan})")
    return found


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
