"""Slow-node eviction during training: which node stays slower than the others, for how long. Pure, torch-free.

In synchronous data-parallel training every rank's *step* takes as long as
the slowest rank's, so step times cannot tell the slow node. Each rank's own
compute can. With DDP the step clock (``task/step_timer.py``, the trainer's
and a task loop's ``StepTimer``) gives each step's own compute: copy,
forward, backward up to the hand-over of the rank's last gradient bucket,
optimizer (``compute_kind: step``); a rank slow in any of them is seen, and a
rank that only waits for a slow peer (in the all-reduce, after its own last
bucket) is not. Without DDP the forward of the rank's module is timed
instead (``trainer/forward_timer.py``, ``compute_kind: forward``). The
heartbeat carries the last 20 (``recent_compute_times_s``); a node's speed is
its slowest rank's median of them (:func:`node_speeds`).

:class:`SlowWatch` is fed those speeds by the supervisor at the heartbeat
rate. A node is slow while its median is more than ``health.eviction.margin``
times the median of the other nodes' medians (leave-one-out, as the burn-in
compares); it is evicted once it has stayed slow for ``window_s`` without a
break, and only when every rank of the step has timed ``min_steps``
samples. Then the supervisor treats it as it treats a lost node
(``healing/decide.py``), except that it never requeues for a slow node: it
swaps in a spare or drops the node, or keeps training on it.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from hpctrain.contract.heartbeat_files import Heartbeat

WHAT = {"step": "step compute", "forward": "forward"}  # a heartbeat's compute_kind in a reason


@dataclass(frozen=True)
class NodeSpeed:
    node: str
    ms: float  # its slowest rank's median compute time
    samples: int  # the fewest samples any of its ranks has timed
    kind: str = "forward"  # what they measure (the heartbeat's compute_kind)


@dataclass(frozen=True)
class SlowNode:
    """A node to evict: its speed, the others', and how long it has been this slow."""

    node: str
    ms: float
    others_ms: float
    slow_for_s: float
    kind: str = "forward"

    @property
    def ratio(self) -> float:
        return self.ms / self.others_ms if self.others_ms > 0 else float("inf")

    def reason(self) -> str:
        """``step compute 412 ms vs 150 ms on the other nodes (2.7x) for 121 s``."""
        return (
            f"{WHAT.get(self.kind, self.kind)} {self.ms:.0f} ms vs {self.others_ms:.0f} ms on the other nodes "
            f"({self.ratio:.1f}x) for {self.slow_for_s:.0f} s"
        )

    def evidence(self) -> dict[str, float | str]:
        return {
            "compute_ms": round(self.ms, 2),
            "compute_kind": self.kind,
            "others_ms": round(self.others_ms, 2),
            "ratio": round(self.ratio, 2),
            "slow_for_s": round(self.slow_for_s, 1),
        }


def node_speeds(
    beats: Iterable[Heartbeat], nodes: Collection[str], *, since: float, last: int = 20
) -> dict[str, NodeSpeed]:
    """Each node of ``nodes`` whose ranks wrote a timed heartbeat after ``since`` (this step's ranks): the
    median of each rank's ``last`` compute times (the heartbeat's own median when it lists none).

    Only one kind is compared: the step's (``step``) where any rank of the step reports it, else ``forward``
    (all ranks of a job measure the same; a mix is a rank of an older install, left out, never compared)."""
    fresh = [beat for beat in beats if beat.node in nodes and beat.time >= since]
    kinds = {beat.compute_kind or "forward" for beat in fresh if beat.compute_count > 0}
    kind = "step" if "step" in kinds else "forward"
    ms: dict[str, float] = {}
    samples: dict[str, int] = {}
    for beat in fresh:
        recent = [t for t in beat.recent_compute_times_s[-last:] if t > 0]
        median = statistics.median(recent) if recent else beat.compute_time_median_s
        if (beat.compute_kind or "forward") != kind or median is None or median <= 0:
            continue
        ms[beat.node] = max(ms.get(beat.node, 0.0), median * 1000)
        samples[beat.node] = min(samples.get(beat.node, beat.compute_count), beat.compute_count)
    return {node: NodeSpeed(node, ms[node], samples[node], kind) for node in ms}


@dataclass
class SlowWatch:
    """Which node has been slower than the others by ``margin``, since when (the supervisor's clock)."""

    margin: float
    window_s: float
    min_steps: int
    since: dict[str, float] = field(default_factory=dict)

    def observe(self, speeds: dict[str, NodeSpeed], expected: int, now: float) -> SlowNode | None:
        """The node to evict now, or None. ``expected``: the step's node count (all must report)."""
        if len(speeds) < max(2, expected) or any(s.samples < self.min_steps for s in speeds.values()):
            return None
        slowest = max(speeds.values(), key=lambda s: s.ms)
        others = statistics.median(s.ms for s in speeds.values() if s.node != slowest.node)
        if others <= 0 or slowest.ms <= self.margin * others:
            self.since.clear()
            return None
        started = self.since.setdefault(slowest.node, now)
        for node in [n for n in self.since if n != slowest.node]:
            del self.since[node]
        if now - started < self.window_s:
            return None
        return SlowNode(slowest.node, slowest.ms, others, now - started, slowest.kind)

    def reset(self) -> None:
        self.since.clear()
