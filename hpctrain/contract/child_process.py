"""Starting a child process that ends with its parent and whose start a stop signal cannot wedge.

Both sides start helpers that must not outlive the process that started them
(``pack``'s mksquashfs, ``submit --local``'s controller). Linux's parent-death
signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``) ends such a child even when its
parent is SIGKILLed, but it is set in the child between fork and exec, by a
``preexec_fn``, and a ``preexec_fn`` makes Python run its fork handlers in the
parent too, among them logging's, which takes and releases its module lock
around the fork. A Ctrl-C, SIGTERM or SIGHUP whose Python handler ran there
left that lock held and the process hung on its way out (seen with ``pack``).
So :func:`start_child` blocks the stop signals until the child is started: one
that came meanwhile is delivered the moment it returns, and the child gets the
old mask back before it execs. Detached watchers that must outlive their
parent (``start_new_session``, no ``preexec_fn``) do not use this.

Imports nothing of the project (``contract/``); no torch.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})  # what a command is stopped with
PARENT_DEATH_SIGNAL = signal.SIGTERM


def start_child(argv: Sequence[str], *, own_group: bool = False, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen)`` of a child that gets SIGTERM when this process ends, even by
    SIGKILL (Linux; elsewhere a plain start), with the stop signals held back until it is started.

    ``own_group``: the child leads a process group of its own, so a terminal's Ctrl-C (sent to the
    foreground group) reaches this process alone, which then stops the child as it sees fit.

    A stop signal that arrived during the start is delivered before this returns; if its handler raises
    (``KeyboardInterrupt``), the new child is killed and reaped first, so none is left behind.
    """
    set_parent_death_signal = _parent_death_setter()  # resolved here: no dlopen in the forked child
    parent = os.getpid()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    def in_child() -> None:
        if own_group:
            os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        if set_parent_death_signal is not None:
            set_parent_death_signal()
            if os.getppid() != parent:  # the parent died before the signal was asked for: none will come
                os._exit(128 + PARENT_DEATH_SIGNAL)

    proc = None
    try:
        proc = subprocess.Popen(argv, preexec_fn=in_child, **popen)  # noqa: PLW1509 - mask + one prctl
    finally:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # a stop that came meanwhile is raised here
        except BaseException:
            if proc is not None:
                proc.kill()
                proc.wait()
            raise
    return proc


def _parent_death_setter() -> Callable[[], None] | None:
    """A call that asks for SIGTERM when the parent ends, or None where libc has no ``prctl``."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL)
