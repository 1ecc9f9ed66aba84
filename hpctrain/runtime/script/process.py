"""What a user script's own process gets from hpctrain: its stop signal and its heartbeat thread. Torch-free.

A ``script:`` job runs the user's program under a wrapper (issue 27), which
sets the variables :mod:`hpctrain.contract.script_env` names. Inside the
script, ``hpctrain.task`` (or a script that only records heartbeats with
``hpctrain.runtime.heartbeat``) calls these once:

* :func:`install_stop_signal`: ``HPCTRAIN_STOP_SIGNAL`` (TERM, INT or USR1;
  TERM when unset) -- what the wrapper sends the script's process group to
  stop it -- becomes a stop request, which the loop sees at its next step
  boundary (``StopRequest.agreed``), never in the middle of a step. A handler
  the script installed itself (its own graceful stop) is kept: hpctrain's
  :class:`StopHandler` notes the stop, then calls it, and says so once on
  stderr; a handler the script installs *after* hpctrain's is named once by
  :meth:`StopHandler.check` (``task.should_stop()`` calls it);
* :func:`start_script_monitor`: the rank's heartbeat thread and, when
  ``HPCTRAIN_HANG_TIMEOUT_S`` is set, the hang watchdog, as the launcher starts
  them for an entry point (``programs/launcher.py``).

A malformed variable is a ``DistributedSetupError`` naming it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.script_env import HANG_TIMEOUT_VAR, HEARTBEAT_INTERVAL_VAR, STOP_SIGNAL_VAR
from hpctrain.errors import DistributedSetupError
from hpctrain.runtime import heartbeat
from hpctrain.runtime.stop import StopRequest, describe_handler

STOP_SIGNALS = ("TERM", "INT", "USR1")  # what script.stop_signal offers
DEFAULT_HEARTBEAT_INTERVAL_S = 10.0  # distributed.heartbeat_interval_s's default


def stop_signal(environ: Mapping[str, str]) -> signal.Signals:
    """The signal that asks this script to stop: ``HPCTRAIN_STOP_SIGNAL`` (``TERM``, ``SIGTERM``, ...)."""
    value = environ.get(STOP_SIGNAL_VAR, "TERM").strip().upper().removeprefix("SIG")
    if value not in STOP_SIGNALS:
        raise DistributedSetupError(
            f"{STOP_SIGNAL_VAR}={environ.get(STOP_SIGNAL_VAR)!r} is not one of {', '.join(STOP_SIGNALS)}",
            hint="hpctrain sets it from script.stop_signal; unset it to use TERM",
        )
    return signal.Signals[f"SIG{value}"]


Say = Callable[[str], None]


def say_on_stderr(text: str) -> None:
    print(f"hpctrain.task: {text}", file=sys.stderr, flush=True)


class StopHandler:
    """hpctrain's handler for the stop signal: notes the stop, then calls the handler it found (the script's own).

    Signal-safe: it only sets the flag and calls on; an exception the script's handler raises (``sys.exit``
    in its graceful stop) goes on to the script as it would without hpctrain.
    """

    def __init__(self, stop: StopRequest, signum: int, previous: Any, say: Say = say_on_stderr) -> None:
        self.stop, self.signum, self.previous, self.say = stop, signal.Signals(signum), previous, say
        self.warned = False

    def __call__(self, number: int, frame: Any) -> None:
        self.stop.note_term()
        previous = self.previous
        if callable(previous):
            previous(number, frame)

    def check(self) -> bool:
        """Whether this is still the signal's handler; says once on stderr when the script replaced it."""
        current = signal.getsignal(self.signum)
        if current is self:
            return True
        if not self.warned:
            self.warned = True
            name = self.signum.name
            if callable(current):
                self.say(
                    f"{name}'s handler was replaced after hpctrain.task installed its own "
                    f"({describe_handler(current)}): "
                    "task.should_stop() hears the job's stop signal only if that handler calls the one "
                    "signal.signal() returned; install yours before the first hpctrain.task call instead: hpctrain "
                    "then calls it after noting the stop"
                )
            else:
                self.say(
                    f"{name} was set to {describe_handler(current)} after hpctrain.task installed its handler: "
                    "task.should_stop() no longer hears the job's stop signal"
                )
        return False


def install_stop_signal(stop: StopRequest, signum: int, say: Say = say_on_stderr) -> StopHandler | None:
    """Route ``signum`` to ``stop`` (as a preemption-like stop), keeping the script's own handler (see the module
    docstring); None when not in the main thread (Python allows handlers only there), said once."""
    if threading.current_thread() is not threading.main_thread():
        say(
            f"hpctrain.task was first called in thread {threading.current_thread().name!r}, not the main thread: "
            f"Python lets only the main thread install a signal handler, so task.should_stop() does not hear "
            f"{signal.Signals(signum).name} (preemption, the time limit, hpctrain cancel), which "
            f"{_without_hpctrain(signal.getsignal(signum))}. Call hpctrain.task() once in the main thread first"
        )
        return None
    handler = StopHandler(stop, signum, chained(signal.getsignal(signum)), say)
    # A signal before this line runs what was there; from it on, hpctrain's note and then that handler.
    found = signal.signal(signum, handler)
    handler.previous = chained(found)  # the same, unless a handler that ran in between changed it
    name = handler.signum.name
    if callable(handler.previous):
        say(
            f"{name} already has this process's own handler ({describe_handler(handler.previous)}): it still runs, "
            "after hpctrain.task notes the stop for task.should_stop()"
        )
    elif found is None:
        say(f"{name} had a handler installed outside Python; hpctrain.task's stop handler replaces it")
    elif found == signal.SIG_IGN:
        say(
            f"{name} was ignored in this process; hpctrain.task now notes it as a stop request instead (processes "
            "started from here on no longer inherit the ignore)"
        )
    return handler


def _without_hpctrain(handler: Any) -> str:
    """What a stop signal does in this process without hpctrain's handler."""
    if handler == signal.SIG_IGN:
        return "this process ignores"
    if callable(handler) and handler is not signal.default_int_handler:
        return f"only this process's own handler ({describe_handler(handler)}) hears"
    return "ends the process at once (no stop checkpoint)"


def chained(handler: Any) -> Any:
    """What hpctrain's handler calls on: the script's own handler; None for the defaults and hpctrain's own
    earlier handler (whose script handler it takes over), so that nothing runs twice."""
    while isinstance(handler, StopHandler):
        handler = handler.previous
    if not callable(handler) or handler is signal.default_int_handler:
        return None
    return handler


def seconds(environ: Mapping[str, str], name: str) -> float | None:
    """A positive number of seconds from ``environ[name]``; None when unset, empty or 0."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise DistributedSetupError(f"{name}={raw!r} is not a number of seconds", hint="hpctrain sets it; unset it")
    return value or None


def start_script_monitor(
    run_dir: Path, environ: Mapping[str, str], *, rank: int, node: str, pid: int, job_id: str
) -> heartbeat.Monitor | None:
    """Start this rank's heartbeat thread (and hang watchdog) into ``run_dir``; None when it does not exist here."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    from hpctrain.runtime.hang import HangWatchdog

    interval = seconds(environ, HEARTBEAT_INTERVAL_VAR) or DEFAULT_HEARTBEAT_INTERVAL_S
    identity: dict[str, Any] = {"rank": rank, "node": node, "pid": pid, "job_id": job_id}
    monitor = heartbeat.Monitor(run_dir, identity, interval_s=interval, first_step=rank == 0)
    limit = seconds(environ, HANG_TIMEOUT_VAR)
    if limit is not None:
        monitor.watchdog = HangWatchdog(
            run_dir, rank=rank, node=node, job_id=job_id, limit_s=limit, recorder=monitor.recorder, flush=monitor.write
        )
    return monitor.start()
