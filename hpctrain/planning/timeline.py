"""From step time to finish: chunks, each chunk's queue wait and restart, hours, and the pick. Pure.

A run longer than its time limit (the spec's ``resources.time``, or the
partition's MaxTime where that is shorter) runs as chunks: each chunk is one
job of the requeue-and-resume chain (docs/requeue.md). Each one pays a
restart (start-up and the checkpoint's load: :data:`RESTART_S` unless told)
and stops training ``signal_delay_s`` before its limit to save; every chunk
after the first is held by Slurm after its requeue (``requeue_hold_s``: the
job credential's lifetime, 120 s by default; none with expedited requeue)
and then waits in the queue again, taken as long as the first start's wait
(what Slurm says now; it cannot say what the queue will be then).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hpctrain.errors import UsageError

RESTART_S = 120.0  # a chunk's start-up (imports, data index, checkpoint load): assumed, docs/planning.md
DEFAULT_MARGIN = 0.10  # the cheapest shape whose time to result is within this of the earliest


@dataclass(frozen=True)
class Timeline:
    """One shape's run: ``chunks`` jobs, seconds from now to start and finish, hours held."""

    chunks: int
    train_s: float  # steps x step time: the training itself
    held_s: float  # allocated time, all chunks (restarts and the last save included)
    start_in_s: float | None  # None: Slurm could not say
    finish_in_s: float | None
    node_hours: float
    gpu_hours: float | None  # None for CPU jobs


def chunk_count(train_s: float, *, limit_s: float, restart_s: float, stop_s: float) -> int:
    """Jobs needed to train ``train_s`` seconds when each trains ``limit_s - restart_s - stop_s`` at most."""
    useful = limit_s - restart_s - stop_s
    if useful <= 0:
        raise UsageError(
            f"a chunk of {limit_s:.0f} s trains not at all after its {restart_s:.0f} s restart and {stop_s:.0f} s stop",
            hint="raise resources.time (or lower signals.signal_delay_s)",
        )
    return max(1, math.ceil(train_s / useful))


def timeline(
    *,
    steps: int,
    step_s: float,
    nodes: int,
    gpus_per_node: int,
    limit_s: float,
    stop_s: float,
    start_in_s: float | None,
    restart_s: float = RESTART_S,
    requeue_hold_s: float = 0.0,
) -> Timeline:
    """The run at one shape: its chunks, when it starts and finishes (seconds from now), its hours."""
    train_s = steps * step_s
    chunks = chunk_count(train_s, limit_s=limit_s, restart_s=restart_s, stop_s=stop_s)
    useful = limit_s - restart_s - stop_s
    last_train_s = train_s - (chunks - 1) * useful
    held_s = (chunks - 1) * limit_s + restart_s + last_train_s
    finish = None if start_in_s is None else start_in_s + held_s + (chunks - 1) * (requeue_hold_s + start_in_s)
    node_hours = nodes * held_s / 3600
    return Timeline(
        chunks, train_s, held_s, start_in_s, finish, node_hours, node_hours * gpus_per_node if gpus_per_node else None
    )


def with_hold(line: Timeline, requeue_hold_s: float) -> Timeline:
    """The same run when each chunk after the first is also held ``requeue_hold_s`` after its requeue (as
    :func:`timeline` counts it): for a caller that asks Slurm for the hold only once it knows there are chunks."""
    if line.finish_in_s is None or line.chunks <= 1:
        return line
    return replace(line, finish_in_s=line.finish_in_s + (line.chunks - 1) * requeue_hold_s)


@dataclass(frozen=True)
class Choice:
    """The recommended shape (node count) and why, in words; ``nodes`` None when none can be recommended."""

    nodes: int | None
    reason: str


def recommend(options: Sequence[tuple[int, Timeline]], margin: float = DEFAULT_MARGIN) -> Choice:
    """The cheapest shape whose finish is within ``margin`` of the earliest finish, among those with one.

    Cost is GPU-hours (node-hours for CPU jobs). Shapes whose start Slurm could
    not say are not chosen: their finish would be a guess.
    """
    known = [(nodes, line) for nodes, line in options if line.finish_in_s is not None]
    if not known:
        return Choice(None, "no shape has a known finish (no start time from Slurm): nothing to compare")
    first_nodes, first = min(known, key=lambda item: (item[1].finish_in_s, _cost(item[1]), item[0]))
    earliest = first.finish_in_s or 0.0
    allowed = earliest + margin * earliest
    close = [(nodes, line) for nodes, line in known if (line.finish_in_s or 0.0) <= allowed]
    pick_nodes, pick = min(close, key=lambda item: (_cost(item[1]), item[1].finish_in_s, item[0]))
    unit = "GPU-hours" if pick.gpu_hours is not None else "node-hours"
    first_text = f"{_nodes(first_nodes)} finishes first (in {duration(earliest)})"
    if pick_nodes == first_nodes:
        cheaper = [n for n, line in known if _cost(line) < _cost(first)]
        why = f"{first_text}"
        if cheaper:
            why += f"; each cheaper shape finishes more than {margin:.0%} later"
        return Choice(first_nodes, why)
    saved = 1 - _cost(pick) / _cost(first) if _cost(first) else 0.0
    return Choice(
        pick_nodes,
        f"{first_text}, but {_nodes(pick_nodes)} finishes within {margin:.0%} of it "
        f"(in {duration(pick.finish_in_s or 0.0)}) for {saved:.0%} fewer {unit}",
    )


def _cost(line: Timeline) -> float:
    return line.gpu_hours if line.gpu_hours is not None else line.node_hours


def _nodes(nodes: int) -> str:
    return f"{nodes} node{'s' if nodes != 1 else ''}"


def duration(seconds: float) -> str:
    """``3 d 4 h``, ``5 h 10 min``, ``12 min``, ``40 s``: the two largest units."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    days, rest = divmod(minutes, 1440)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"
