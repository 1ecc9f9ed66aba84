"""What a user script's own process gets from hpctrain: its stop signal and its heartbeat thread. Torch-free.

A ``script:`` job runs the user's program under a wrapper (issue 27), which
sets the variables :mod:`hpctrain.contract.script_env` names. Inside the
script, ``hpctrain.task`` (or a script that only records heartbeats with
``hpctrain.runtime.heartbeat``) calls these once:

* :func:`install_stop_signal`: ``HPCTRAIN_STOP_SIGNAL`` (TERM, INT or USR1;
  TERM when unset) -- what the wrapper sends the script's process group to
  stop it -- becomes a stop request, which the loop sees at its next step
  boundary (``StopRequest.agreed``), never in the middle of a step;
* :func:`start_script_monitor`: the rank's heartbeat thread and, when
  ``HPCTRAIN_HANG_TIMEOUT_S`` is set, the hang watchdog, as the launcher starts
  them for an entry point (``programs/launcher.py``).

A malformed variable is a ``DistributedSetupError`` naming it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.contract.script_env import HANG_TIMEOUT_VAR, HEARTBEAT_INTERVAL_VAR, STOP_SIGNAL_VAR
from hpctrain.errors import DistributedSetupError
from hpctrain.runtime import heartbeat
from hpctrain.runtime.stop import StopRequest

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


def install_stop_signal(stop: StopRequest, signum: int) -> bool:
    """Route ``signum`` to ``stop`` (as a preemption-like stop); False when not in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def on_stop(number: int, frame: object) -> None:
        stop.note_term()

    signal.signal(signum, on_stop)
    return True


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
