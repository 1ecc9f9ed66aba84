"""Stop signals from a process's first moment: hold them across exec, count them, pass them on.

Slurm asks a task to stop with a signal: SIGTERM (a preemption, a cancel, a
requeue) or the time-limit warning (``--signal=USR2@N``, or USR1). A task is
a chain of programs before it can act on one: srun starts ``python -m
hpctrain.runtime.cleanup exec ...`` (the reaper's token), which execs
``python -m submitit.core._submit``, which imports numpy, unpickles the task
(pydantic, the spec), installs submitit's *own* handlers (SIGTERM: "Bypassing
signal", dropped; USR2: checkpoint and requeue inside the handler) and only
then calls hpctrain, whose entry point imports torch. A signal in those
seconds was dropped, or killed the task (measured on the 24.11 test cluster:
preempted 9 s into a start, the run trained on for 73 s until GraceTime ran
out). So, in the order a task meets them:

* :func:`hold` blocks the stop signals in the first Python of the task (the
  exec wrapper, ``cleanup.py``). A blocked signal stays pending, across
  ``exec`` and whatever handler submitit installs meanwhile.
* :func:`listen` installs handlers that only count, then unblocks: what was
  pending is counted at once. The task launcher calls it first thing.
* :func:`hand_over` gives the counts to the ``StopRequest`` (``stop.py``)
  once its handlers are installed: from then on they count.
* A process whose children must hear the same signals (torchrun's node task,
  a script wrapper) starts them held (:func:`hold`, then spawn), tells them
  what it counted before (:func:`child_environ`), and passes later signals on
  with a :class:`Relay`, which also gives a child that appears late every
  signal it missed, each once.
* A forked child that sets up its own handling (a data-loader worker) is
  forked inside :func:`held`: a signal sent to it before it is ready waits.
* ``python -m hpctrain.runtime.stop_signals MODULE ARGS...`` runs MODULE as a
  program that counts from its first line (the healing supervisor).

Blocking is per thread and inherited by children (fork, exec, Popen); a
child's pending set starts empty; an *ignored* signal is discarded even while
blocked, so held signals are never set to SIG_IGN. Two gaps stay, and are
covered elsewhere: the interpreter's own start before the wrapper's first line
(the default action ends the task; tens of ms), and a signal Slurm sent
before the task existed (a preemption signals only the job's steps), which
the launcher asks Slurm about (``requeue.slurm_stop_reason``). Standard
library only: this runs in a process's first milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from typing import Protocol

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
# What a parent counted before this process existed: "TERM=1,USR2=0" (child_environ).
SEEN_VAR = "HPCTRAIN_STOP_SIGNALS_SEEN"
RELAY_POLL_S = 0.5


class StopSink(Protocol):
    """What takes the counted signals over: ``hpctrain.runtime.stop.StopRequest``, or any process's own flag."""

    def note_term(self) -> None: ...

    def note_timeout(self) -> None: ...


def signal_name(signum: int) -> str:
    """'TERM' for SIGTERM: the name ``--signal`` and ``signals.timeout_signal`` use."""
    return signal.Signals(signum).name.removeprefix("SIG")


def parse_seen(text: str) -> dict[str, int]:
    """``TERM=1,USR2=2`` -> counts; anything malformed is left out (the variable is only ever ours). Pure."""
    counts: dict[str, int] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() and value.strip().isdigit():
            counts[name.strip()] = counts.get(name.strip(), 0) + int(value)
    return counts


def format_seen(counts: Mapping[str, int]) -> str:
    return ",".join(f"{name}={count}" for name, count in sorted(counts.items()) if count > 0)


class Recorder:
    """A signal handler that counts, by signal name; starts from what a parent counted."""

    def __init__(self, inherited: Mapping[str, int] | None = None) -> None:
        self.counts: dict[str, int] = dict(inherited or {})

    def __call__(self, signum: int, frame: object) -> None:
        name = signal_name(signum)  # runs between bytecodes in the main thread: nothing here may raise
        self.counts[name] = self.counts.get(name, 0) + 1

    def seen(self) -> dict[str, int]:
        return dict(self.counts)


_recorder: Recorder | None = None


def hold(signals: Iterable[int] = STOP_SIGNALS) -> None:
    """Block ``signals`` in this thread: they wait, pending, until :func:`listen` (also across exec)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))


@contextlib.contextmanager
def held(signals: Iterable[int] = STOP_SIGNALS) -> Iterator[None]:
    """``signals`` blocked in this thread for the block, the mask as it was after it.

    For a fork whose child sets up its own handling of the stop signals (a data-loader
    worker): the child starts with them held, so one sent to it before it is ready waits,
    pending, for its handling instead of ending it. In the parent a signal that arrives
    meanwhile is pending too (or taken by another thread), never lost.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def obey_only_parent(signals: Iterable[int], *, exit_on: int = signal.SIGTERM) -> None:
    """In a forked worker (a data-loader's), main thread: ``exit_on`` sent by the parent ends it at once
    (what the parent's ``terminate()`` asks); every other one of ``signals`` and ``exit_on`` -- the job's,
    which Slurm's linuxproc, a cancel or a preemption sends to every process of the task -- is dropped.

    The worker's process decides when it ends: a worker that died of the job's signal made its rank
    fail where it stood, before its stop checkpoint. One thread waits for the signals; they are
    blocked in this thread and in every thread started later (a worker forked inside :func:`held`
    has them blocked from its first instruction, so one sent before this call is judged here too).
    """
    parent = os.getppid()
    wanted = {*signals, exit_on}
    for signum in wanted:
        signal.signal(signum, _never_fatal)  # whichever thread the kernel picks, if one does not block it
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)

    def filter_signals() -> None:
        while True:
            info = signal.sigwaitinfo(wanted)
            if info.si_signo == exit_on and info.si_pid == parent:
                os._exit(0)

    threading.Thread(target=filter_signals, name="sigterm-filter", daemon=True).start()


def _never_fatal(signum: int, frame: object) -> None:
    return None


def listen(environ: MutableMapping[str, str] | None = None) -> Recorder:
    """Count every stop signal from now on, the held ones first; then unblock them. Main thread only.

    Takes over what the parent counted (:data:`SEEN_VAR`, removed from ``environ`` so
    that this process's own children do not inherit it). Calling it again only unblocks.
    """
    global _recorder
    environ = os.environ if environ is None else environ
    if _recorder is None:
        _recorder = Recorder(parse_seen(environ.pop(SEEN_VAR, "")))
        for signum in STOP_SIGNALS:
            signal.signal(signum, _recorder)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))
    return _recorder


def recorded() -> dict[str, int]:
    """What :func:`listen`'s handlers counted so far (by name: TERM, USR1, USR2); empty before it."""
    return _recorder.seen() if _recorder is not None else {}


def hand_over(sink: StopSink, timeout_signal: str) -> dict[str, int]:
    """Give ``sink`` what was counted before its own handlers: SIGTERM as ``note_term``, the time-limit
    signal (``USR2``) as ``note_timeout``; the other USR signal means nothing here. Call it right after
    installing the handlers that count from now on; returns what was handed over."""
    counts = recorded()
    for _ in range(counts.get("TERM", 0)):
        sink.note_term()
    for _ in range(counts.get(timeout_signal, 0)):
        sink.note_timeout()
    return counts


def child_environ(environ: Mapping[str, str], counts: Mapping[str, int]) -> dict[str, str]:
    """A child's environment that tells it what this process counted before it existed. Pure."""
    child = dict(environ)
    child.pop(SEEN_VAR, None)
    if format_seen(counts):
        child[SEEN_VAR] = format_seen(counts)
    return child


class Relay:
    """Passes ``signals`` on to the processes ``targets()`` names: each signal once to each process,
    also to one that appears only later (it gets what it missed). Handlers in the main thread only
    count; one thread sends. Start it in the main thread."""

    def __init__(
        self, targets: Callable[[], Iterable[int]], signals: Iterable[int], *, poll_s: float = RELAY_POLL_S
    ) -> None:
        self.targets, self.signals, self.poll_s = targets, tuple(signals), poll_s
        self.received: dict[int, int] = dict.fromkeys(self.signals, 0)
        self.sent: dict[int, dict[int, int]] = {}  # pid -> signal -> how many it got
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="hpctrain-signal-relay", daemon=True)

    def start(self) -> Relay:
        """Install the handlers, then unblock ``signals`` (what was held arrives now and is relayed)."""
        for signum in self.signals:
            signal.signal(signum, self._count)
        self._thread.start()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self.signals))
        return self

    def stop(self) -> None:
        """Send what is still owed to the current targets, then end the thread."""
        self._stopping = True
        self._wake()
        self._thread.join(timeout=5)

    def _count(self, signum: int, frame: object) -> None:
        self.received[signum] = self.received.get(signum, 0) + 1  # only the main thread writes
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_write, b".")
        except OSError:  # the pipe is full: a wake-up is pending anyway
            pass

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([self._wake_read], [], [], self.poll_s)
            if ready:
                os.read(self._wake_read, 4096)
            self.deliver()
            if self._stopping:
                return

    def deliver(self) -> None:
        """Send every current target what it has not had yet."""
        try:
            pids = list(self.targets())
        except Exception:  # the targets' parent is gone: nobody to tell
            return
        for pid in pids:
            sent = self.sent.setdefault(pid, {})
            for signum, count in list(self.received.items()):
                while sent.get(signum, 0) < count:
                    sent[signum] = sent.get(signum, 0) + 1
                    try:
                        os.kill(pid, signum)
                    except OSError:  # it ended meanwhile
                        break


def run_module(argv: list[str]) -> None:
    """``python -m hpctrain.runtime.stop_signals MODULE ARGS...``: MODULE as ``__main__``, counted from here."""
    if not argv:
        raise SystemExit(f"usage: python -m {__spec__.name if __spec__ else 'stop_signals'} MODULE [ARGS...]")
    listen()
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    from hpctrain.runtime import stop_signals as importable  # the copy MODULE imports, not this __main__

    importable.run_module(sys.argv[1:])
