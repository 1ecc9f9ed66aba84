"""The agreed stop flag of a user's loop: every rank gets the same answer at the same step.

A time-limit warning, a preemption or ``hpctrain cancel`` reaches the ranks as
signals, at any moment and not necessarily on every rank. Their handlers only
note it (``runtime/stop.py``); :func:`should_stop`, called by every rank at
the same step boundary, all-reduces the ranks' notes (one small collective),
so all of them stop at the same step, save, and return :func:`stopped`::

    for step in range(start, total):
        if reason := task.should_stop():
            checkpointer.save(step)
            return task.stopped()
        ...

The entry point's launcher sees the returned ``{"status": "stopped", ...}``
and requeues the job (or lets Slurm requeue it, or ends it when cancelled);
a script's wrapper knows it asked the script to stop and does the same when
the script exits.
"""

from __future__ import annotations

from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.runtime.stop import StopReason
from hpctrain.task.process_group import require_group
from hpctrain.task.session import session


def should_stop() -> StopReason | None:
    """Why every rank stops now (``timeout``, ``preempted``, ``cancelled``), or None to go on.

    Collective when torch.distributed is up: every rank must call it at the same step boundaries.
    """
    require_group("hpctrain.task.should_stop()")
    current = session()
    if current.stop_handler is not None:
        current.stop_handler.check()  # says once when the script replaced it since
    reason = current.stop.agreed()
    current.agreed = reason
    return reason


def stop_reason() -> StopReason | None:
    """The reason :func:`should_stop` last agreed on (no collective), or None."""
    return session().agreed


def stopped(**fields: Any) -> dict[str, Any]:
    """Record the stop (rank 0: summary.json says ``stopped``) and return what an entry point returns.

    ``fields`` are added to the returned dict. Call it after :func:`should_stop` said to stop.
    """
    current = session()
    reason = current.agreed
    if reason is None:
        raise HpctrainError(
            "hpctrain.task.stopped() was called but the ranks never agreed to stop",
            hint="call it only after `if reason := hpctrain.task.should_stop():`; to end early, just return",
        )
    if current.summary is not None:
        current.summary.stopped(reason)
    return {**fields, "status": "stopped", "stop_reason": reason}
