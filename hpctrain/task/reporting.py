"""What a user's loop tells the outside world: metrics, the run's summary, heartbeats.

* :func:`log` appends one ``train_step`` record to the run's ``metrics.jsonl``
  through ``contract/metrics.py`` (rank 0 only; other ranks return at once),
  so ``hpctrain status --watch`` shows the step rate and ``hpctrain report``
  plots the curves. The report plots the scalars named ``loss``, ``lr``,
  ``top1``, ``top5``, ``images_per_s`` and ``data_wait_fraction``; any other
  number is recorded too.
* :func:`set_summary` adds the loop's own facts (final accuracy, a digest of
  the weights) to ``summary.json``, which hpctrain keeps for the run
  (``runtime/run_summary.py``: running, progress, stopped, completed).
* :func:`step`, :func:`phase` and :func:`beat` record what the rank is doing
  for its heartbeat thread: ``status --watch --ranks``, stragglers and the
  hang watchdog read them (docs/hangs.md). They cost a few attribute writes.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

from hpctrain.contract.metrics import MetricsAppender
from hpctrain.errors import HpctrainError
from hpctrain.runtime import heartbeat
from hpctrain.runtime.run_summary import STATUS_KEYS
from hpctrain.task.session import session

RESERVED = frozenset({"kind", "time", "global_step", "epoch", "rank"})  # the record's own fields


def log(step: int, *, epoch: int | None = None, **scalars: Any) -> None:
    """Record ``scalars`` (numbers, or one-element tensors) for optimizer step ``step`` (rank 0 writes).

    ``epoch`` (0-based) places the record on the report's epoch axis. A tensor is read with
    ``.item()``, which waits for the device: log every few steps, not every step, on a GPU.
    """
    current = session()
    if not current.info.is_main:
        return
    record: dict[str, Any] = {"kind": "train_step", "global_step": _count(step, "step")}
    if epoch is not None:
        record["epoch"] = _count(epoch, "epoch")
    for name, value in scalars.items():
        if name in RESERVED:
            raise HpctrainError(
                f"hpctrain.task.log: {name!r} is a field of the record itself",
                hint=f"rename the scalar (reserved: {', '.join(sorted(RESERVED))}; epoch= is the epoch)",
            )
        record[name] = _number(name, value)
    _append(current, record)
    if current.summary is not None:
        current.summary.progress(record["global_step"])


def append_record(record: dict[str, Any]) -> None:
    """Append a record hpctrain built (a ``step_split`` window of :class:`hpctrain.task.StepTimer`); rank 0 writes."""
    current = session()
    if current.info.is_main:
        _append(current, record)


def _append(current: Any, record: dict[str, Any]) -> None:
    appender = current.extra.get("metrics")
    if appender is None:
        appender = current.extra["metrics"] = MetricsAppender(current.info.run_dir)
    appender.append(record, now=time.time())


def set_summary(**fields: Any) -> None:
    """Add ``fields`` (JSON values) to this attempt's ``summary.json`` (rank 0 writes; others ignore it)."""
    taken = sorted(set(fields) & set(STATUS_KEYS))
    if taken:
        raise HpctrainError(
            f"hpctrain.task.set_summary: {', '.join(taken)} {'is' if len(taken) == 1 else 'are'} hpctrain's to set",
            hint="hpctrain records the status, stop reason, step and restarts itself; use other names",
        )
    current = session()
    if current.info.is_main and current.summary is not None:
        current.summary.write(**fields)


def step(number: int, epoch: int | None = None) -> None:
    """Optimizer step ``number`` is done (arms the hang watchdog; the heartbeat shows it)."""
    session()  # a script's heartbeat thread starts with the session
    heartbeat.step(number, epoch)


def phase(name: str) -> heartbeat.phase:
    """``with task.phase("data"):`` -- the rank is in phase ``name`` inside the block (``checkpoint``
    and ``done`` pause the hang watchdog; docs/hangs.md lists the others)."""
    session()
    return heartbeat.phase(name)


def beat() -> None:
    """Progress without a new step (one validation batch): keeps the hang watchdog quiet."""
    heartbeat.beat()


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 0:
        raise HpctrainError(f"hpctrain.task.log: {name} must be a whole number >= 0 (got {value!r})")
    return int(value)


def _number(name: str, value: Any) -> float | int:
    if hasattr(value, "item") and callable(value.item) and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise HpctrainError(
            f"hpctrain.task.log: {name}={value!r} is not a number",
            hint="log numbers (a one-element tensor is read with .item())",
        )
    # NaN and inf are written as they are; readers leave them out (contract/metrics.py)
    return int(value) if isinstance(value, numbers.Integral) else float(value)
