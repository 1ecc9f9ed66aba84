"""The what-if model: a step's time at a scale never measured, from the parts measured at others. Pure.

One model, two users: the report's what-if (``observe/report/causes.py``:
2x and 4x the largest measured scale) and ``hpctrain plan``
(``planning/step_time.py``: every shape it is asked about), so the two give
the same number for the same scale from the same ``step_split`` records.

A measured :class:`Scale` is a run's steady split (the mean of its
``step_split`` records but the first window of each epoch). The model at
``devices`` (GPUs, or processes where the runs used no GPU), for a per-rank
batch given as ``per_image`` (ranks / global batch; the largest measured
scale's when not given):

* **the rank's own work** (data wait, host-to-device copy, forward,
  backward, optimizer, the loop) is per image and rank as measured at the
  *anchor*, the measured scale nearest in log2(devices) (the largest, above
  it): it stays fixed per rank when the per-rank batch does (weak scaling,
  ``trainer.batch_size`` per device) and shrinks as 1/n when a fixed global
  batch is spread over n times the ranks;
* **straggler wait** is per image as measured at the anchor (above the
  largest scale, the largest's: more nodes bring more chances of a slow one,
  so this is a floor);
* **checkpoint stall** is per step as measured at the anchor (a save costs
  what the model's size costs, whatever the batch);
* **exposed communication** is per step (the gradients' size is the
  model's): through the measured scales piecewise linear in log2(devices);
  above the largest, the line through the two largest (a ring all-reduce's
  latency term grows with log p, its bandwidth term is flat), never below the
  largest's; below the smallest, the line through the two smallest, between 0
  and the smallest's. One device has neither communication nor stragglers.

What dominates at a scale is said as the report's bars say it: above the
smallest measured scale, the part that grew the most against it (its scaling
bar, per image and rank); at or below it, the largest part of the step that is
not compute (its step bar). The names are ``step_split.LABELS``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

from hpctrain.contract.step_split import COMPUTE, LABELS, PARTS, parts_of

PER_STEP = ("checkpoint", "log", "comm")  # seconds per step whatever the per-rank batch; the other parts are per image


class _Measured(Protocol):
    @property
    def devices(self) -> int: ...
    @property
    def windows(self) -> int: ...


M = TypeVar("M", bound=_Measured)


@dataclass(frozen=True)
class Scale:
    """One measured scale: ``parts`` in seconds per step (:data:`~hpctrain.contract.step_split.PARTS`)."""

    devices: int
    per_image: float  # ranks / global batch: seconds per step x this = seconds per image and rank (1.0: unknown)
    parts: Mapping[str, float]
    windows: int = 1

    @property
    def step_s(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class Estimate:
    """The model's answer at one scale, what dominates there, and the model in words."""

    devices: int
    step_s: float
    parts: dict[str, float]
    efficiency: float  # the smallest measured scale's step per image and rank over this one's
    dominant: str  # a PARTS name, or "compute" (the compute parts together, when they grew the most)
    dominant_loss: float  # its share of the step
    measured: bool  # ``devices`` is a measured scale (the parts are the measured ones)
    model: str

    @property
    def dominant_label(self) -> str:
        return label(self.dominant)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def label(part: str) -> str:
    """The report's words for a part: ``exposed communication``, ``data wait``, ``compute``."""
    return LABELS.get(part, part)


def steady_records(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The step_split records without the first of each epoch of each attempt (when that epoch has more)."""
    groups: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    for record in records:
        groups.setdefault((record.get("attempt"), record.get("epoch")), []).append(record)
    steady = [r for group in groups.values() for r in (group[1:] if len(group) > 1 else group)]
    return sorted(steady, key=lambda r: r.get("global_step") or 0)


def usable(records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The steady records with a positive step time: what a split is the mean of."""
    return [r for r in steady_records(records) if isinstance(r.get("step_s"), (int, float)) and r["step_s"] > 0]


def mean_parts(steady: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The mean of each part over ``steady`` (non-empty) records, seconds per step."""
    return {p: statistics.fmean(parts_of(r)[p] for r in steady) for p in PARTS}


def ranks_of(steady: Sequence[Mapping[str, Any]]) -> int:
    return max(int(r.get("ranks") or 1) for r in steady)


def scale_of(records: Sequence[Mapping[str, Any]], *, devices: int | None, global_batch: int | None) -> Scale | None:
    """A run's measured scale from its step_split records (``devices``: the ranks when unknown); None without any."""
    steady = usable(records)
    if not steady:
        return None
    ranks = ranks_of(steady)
    per_image = ranks / global_batch if global_batch else 1.0
    return Scale(devices or ranks, per_image, mean_parts(steady), len(steady))


def one_per_scale(measured: Sequence[M]) -> list[M]:
    """One per number of devices (the one with the most windows), fewest devices first."""
    best: dict[int, M] = {}
    for item in measured:
        if item.devices not in best or item.windows > best[item.devices].windows:
            best[item.devices] = item
    return [best[d] for d in sorted(best)]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


class StepModel:
    """The model over measured scales (see the module docstring); ``at(devices)`` answers for any scale."""

    def __init__(self, scales: Sequence[Scale], kind: str = "devices") -> None:
        self.kind = kind  # what a scale counts, plural: "GPUs", "processes"
        self.scales = one_per_scale([s for s in scales if s.devices >= 1 and s.step_s > 0])
        if not self.scales:
            raise ValueError("the step model needs at least one measured scale")

    def at(self, devices: int, per_image: float | None = None) -> Estimate:
        """The step at ``devices`` with ``per_image`` (ranks / global batch; the largest scale's if None)."""
        if devices < 1:
            raise ValueError(f"devices must be at least 1, not {devices}")
        base, top = self.scales[0], self.scales[-1]
        per = per_image if per_image and per_image > 0 else top.per_image
        anchor = min(reversed(self.scales), key=lambda s: abs(math.log2(s.devices) - math.log2(devices)))
        parts = {p: anchor.parts[p] * (1 if p in PER_STEP else anchor.per_image / per) for p in PARTS}
        comm, how = self._comm(devices)
        parts["comm"] = comm
        if devices == 1:
            parts["comm"] = parts["straggler"] = 0.0
            how = "none on one device"
        step = sum(parts.values())
        efficiency = base.step_s * base.per_image / per / step
        if devices > base.devices:  # the scaling bar: what grew against the smallest scale, per image and rank
            grown = {p: parts[p] - base.parts[p] * base.per_image / per for p in PARTS if p not in COMPUTE}
            grown["compute"] = sum(parts[p] - base.parts[p] * base.per_image / per for p in COMPUTE)
        else:  # the step bar: every part that is not compute is a loss
            grown = {p: parts[p] for p in PARTS if p not in COMPUTE}
        dominant = max(grown, key=grown.__getitem__)
        measured = any(s.devices == devices for s in self.scales)
        where = f"{anchor.devices} {self.kind}" + ("" if measured else " (the nearest measured)")
        model = (
            f"step-split model: the rank's own work per image as measured at {where}; "
            f"exposed communication {_ms(parts['comm'])} per step ({how})"
        )
        return Estimate(devices, step, parts, efficiency, dominant, grown[dominant] / step, measured, model)

    def _comm(self, devices: int) -> tuple[float, str]:
        """Exposed communication per step at ``devices``, and how it was found (words)."""
        points = [(math.log2(s.devices), s.parts["comm"], f"{s.devices} {self.kind}") for s in self.scales]
        x = math.log2(devices)
        exact = next((c for px, c, _ in points if px == x), None)
        if exact is not None:
            return exact, "measured"
        if len(points) == 1:
            return points[0][1], f"held at the one measured scale's, {points[0][2]}: optimistic"
        if x > points[-1][0]:
            (x0, c0, d0), (x1, c1, d1) = points[-2], points[-1]
            line = c1 + (c1 - c0) / (x1 - x0) * (x - x1)
            return max(c1, line), f"a line in log2(devices) through {_ms(c0)} at {d0} and {_ms(c1)} at {d1}"
        if x < points[0][0]:
            (x0, c0, d0), (x1, c1, d1) = points[0], points[1]
            line = c0 + (c1 - c0) / (x1 - x0) * (x - x0)
            return min(c0, max(0.0, line)), f"a line in log2(devices) through {_ms(c0)} at {d0} and {_ms(c1)} at {d1}"
        (x0, c0, d0), (x1, c1, d1) = next((a, b) for a, b in zip(points, points[1:]) if a[0] < x < b[0])
        line = c0 + (c1 - c0) / (x1 - x0) * (x - x0)
        return line, f"between {_ms(c0)} at {d0} and {_ms(c1)} at {d1}, in log2(devices)"


def run_devices(
    nodes: int | None, gpus_per_node: int | None, world: int | None, on_cpu: bool
) -> tuple[int | None, str]:
    """(devices, kind) of a run: its GPUs (nodes x gpus_per_node) when it used them, else its processes."""
    if not on_cpu and gpus_per_node and nodes:
        return nodes * gpus_per_node, "GPU"
    return world, "process"
