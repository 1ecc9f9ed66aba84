"""Where each step's time went: the parts every rank measures, and the ``step_split`` record. Torch-free.

Every rank laps a clock through each step (``task/step_timer.py``: the built-in trainer, your own loop):
each interval of the step's wall time goes to exactly one *measured* part, so on
a rank the parts add up to its wall time. Over a log window the ranks gather
their sums (one small all-gather per window, never per step) and rank 0 turns
them into one ``step_split`` record of ``metrics.jsonl`` with :func:`split_record`.

A rank cannot see why it waited in a collective: the time after its backward
until the all-reduce completes (``comm``) and in the step's other collectives
(``sync``: the stop agreement; DDP's buffer broadcast before the module's
forward) is either transfer or waiting for a slower rank.
The ranks' sums tell them apart: the *typical* rank is the median of the ranks
other than the slowest one (the one with the most local work); whatever the
slowest rank's local work exceeds it by is **straggler** wait, everyone's; the
rest of the wall time beyond the typical local work, the checkpoint stall and
the **log** writes is **exposed communication**. Like a checkpoint stall,
rank 0's writes of a window's records after its gather (``metrics.jsonl``,
TensorBoard, the tracker's queue, the log line: ``log``) hold up every rank,
which waits for them in its next collective: the record counts the longest
rank's as every rank's, never as communication. The record's parts (``<part>_s``, seconds per
step) therefore add up to the window's mean step time (``step_s``) by
construction; that they agree with the step time measured independently (the
``train_step`` record's ``step_s``) is what the tests check.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# What a rank laps its clock into, in the order a step meets them.
# ``unsplit``: a strategy with a step of its own (pipeline, ps) is timed whole, its communication inside it.
MEASURED = ("data", "h2d", "forward", "backward", "comm", "optimizer", "unsplit", "checkpoint", "sync", "other", "log")
LOCAL = ("data", "h2d", "forward", "backward", "optimizer", "unsplit", "other")  # the rank's own work
# The parts of a step_split record (its ``<part>_s`` fields), in the order a waterfall shows them.
PARTS = (
    "data",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "unsplit",
    "other",
    "log",
    "checkpoint",
    "comm",
    "straggler",
)
COMPUTE = ("h2d", "forward", "backward", "optimizer", "unsplit")  # what a perfectly scaled step would still take
# A rank's own compute in a step, without any wait for a peer (the backward ends at its last gradient bucket's
# hand-over): what slow-node eviction compares (``healing/eviction.py``). Not ``data`` (a shared file system's
# stalls are no node's fault), not ``unsplit`` (a strategy's own step has its communication inside).
OWN = ("h2d", "forward", "backward", "optimizer")
LABELS = {
    "data": "data wait",
    "h2d": "host-to-device copy",
    "forward": "forward",
    "backward": "backward compute",
    "optimizer": "optimizer",
    "unsplit": "step (not split: the strategy's own)",
    "other": "other (the loop, callbacks)",
    "log": "log writes (rank 0's records)",
    "checkpoint": "checkpoint stall",
    "comm": "exposed communication",
    "straggler": "straggler wait",
}
KIND = "step_split"


def _typical(values: Sequence[float], slowest: int) -> float:
    others = [v for i, v in enumerate(values) if i != slowest] or list(values)
    return statistics.median(others)


def split_record(
    rank_sums: Sequence[Mapping[str, float]], walls: Sequence[float], steps: int, *, global_step: int, epoch: int
) -> dict[str, Any]:
    """The ``step_split`` record of one window from every rank's lapped sums (seconds over ``steps`` steps).

    ``rank_sums[r]`` maps each :data:`MEASURED` part to rank r's seconds, ``walls[r]`` is rank r's wall time
    over the window. Fields: ``<part>_s`` per :data:`PARTS` and ``step_s`` (seconds per step), ``ranks``,
    ``steps``, ``slowest_rank``, and ``slowest_<local part>_s``: how much more the slowest rank spent in each
    of its own parts than the typical rank (which part makes it slow).
    """
    if not rank_sums or steps <= 0:
        raise ValueError("a step split needs at least one rank and one step")
    n = float(steps)
    local = [sum(sums.get(p, 0.0) for p in LOCAL) for sums in rank_sums]
    slowest = max(range(len(local)), key=local.__getitem__)
    typical = {p: _typical([s.get(p, 0.0) for s in rank_sums], slowest) / n for p in LOCAL}
    wall = statistics.fmean(walls) / n
    checkpoint = max(s.get("checkpoint", 0.0) for s in rank_sums) / n  # a stall on one rank holds up all
    log = max(s.get("log", 0.0) for s in rank_sums) / n  # rank 0's writes: the others wait for them
    straggler = max(0.0, local[slowest] / n - sum(typical.values())) if len(rank_sums) > 1 else 0.0
    comm = wall - sum(typical.values()) - checkpoint - log - straggler
    if len(rank_sums) == 1:  # no collective to wait in: the stop check's and the loop's own time
        typical["other"] += max(0.0, comm)
        comm = min(0.0, comm)
    if comm < 0:  # measured waits shorter than the split implies (clock noise): keep the sum, trim straggler
        straggler, comm = max(0.0, straggler + comm), 0.0
    record: dict[str, Any] = {"kind": KIND, "epoch": epoch, "global_step": global_step}
    record.update({f"{p}_s": typical[p] for p in LOCAL})
    record.update({"log_s": log, "checkpoint_s": checkpoint, "comm_s": comm, "straggler_s": straggler, "step_s": wall})
    record.update({"ranks": len(rank_sums), "steps": steps, "slowest_rank": slowest})
    slow = rank_sums[slowest]
    record.update({f"slowest_{p}_s": max(0.0, slow.get(p, 0.0) / n - typical[p]) for p in LOCAL})
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()}


SHORT = {"data": "data", "h2d": "copy", "forward": "fwd", "backward": "bwd", "optimizer": "opt", "other": "loop"}
SHORT |= {"unsplit": "step", "log": "log"}
SHORT |= {"checkpoint": "ckpt", "comm": "comm", "straggler": "straggler"}


def brief(record: Mapping[str, Any]) -> str | None:
    """``fwd 21% bwd 43% comm 22% straggler 7% (slowest rank 5) data 4%``: the parts of at least 1 %, largest first."""
    parts = parts_of(record)
    total = sum(parts.values())
    if total <= 0:
        return None
    shown = sorted((v / total, p) for p, v in parts.items() if v / total >= 0.01)[::-1]
    text = " ".join(f"{SHORT[p]} {share * 100:.0f}%" for share, p in shown)
    slowest = record.get("slowest_rank")
    if parts["straggler"] / total >= 0.01 and isinstance(slowest, int):
        text = text.replace("straggler ", f"straggler(rank {slowest}) ")
    return text


def parts_of(record: Mapping[str, Any]) -> dict[str, float]:
    """A step_split record's parts in seconds per step (a missing or unreadable one as 0)."""
    out = {}
    for part in PARTS:
        value = record.get(f"{part}_s")
        out[part] = float(value) if isinstance(value, (int, float)) and value >= 0 else 0.0
    return out
