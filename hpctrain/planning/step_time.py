"""The step time at each shape, from the best source, always named. Pure.

Best first: this spec's earlier runs and study points at that node count
(the wall time per step between their logged steps, whatever ran between
them within a start included; the median of the logged step times where
too few were logged in a row); for node counts never measured, the
report's what-if model (``contract/scaling_model.py``) when an earlier run
logged ``step_split`` records, else a scaling model fitted to the step
times; the user's own ``--step-time`` (at the spec's own node count, or the
one it names). Every shape's :class:`StepTime` says which (``model``) and,
where the split model answers, what dominates there in the report's words.

``trainer.batch_size`` is per device, so every shape does the same work per
device and step: the split model keeps the rank's own work per image of the
largest measured scale and grows the exposed communication in log2(devices).
Without step_split records, with two or more
measured node counts the model is ``t(n) = a + b * log2(n)`` (least squares,
``b`` at least 0: a step never gets faster with more nodes at a fixed
per-device batch; the log term is what a tree or ring all-reduce adds); with
one, ``t(n) = t(n0)`` (perfect weak scaling: the optimistic bound). Every
shape the model answers for is marked extrapolated, with the model in words.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpctrain.contract.scaling_model import Scale, StepModel, label


@dataclass(frozen=True)
class Measurement:
    """One earlier run's step time at ``nodes`` over ``steps`` logged steps (seconds): the wall time per step
    between them ("wall": validation and checkpoints included) or their median ("median")."""

    nodes: int
    step_s: float
    steps: int
    where: str  # the run directory (or study point), for the plan's sources
    scale: Scale | None = None  # its step_split records as a scale of the what-if model, when it logged them
    basis: str = "median"


@dataclass(frozen=True)
class StepTime:
    """The step time a plan uses at one shape, where it came from, and whether it was measured there."""

    seconds: float
    source: str
    extrapolated: bool
    model: str = "measured"  # "measured", "step split" (the report's what-if model), "fit" (a + b log2 n), "yours"
    dominant: str | None = None  # what loses the most there, in the report's words (the split model only)
    dominant_loss: float | None = None  # its share of the step

    def dominates(self) -> str:
        """``exposed communication 23 %``, or "" where no split model says."""
        if self.dominant is None or self.dominant_loss is None:
            return ""
        return f"{self.dominant} {self.dominant_loss * 100:.0f} %"


@dataclass(frozen=True)
class ScalingModel:
    """``t(n) = a + b * log2(n)`` seconds per step, fitted to ``points`` (node count -> seconds)."""

    a: float
    b: float
    points: tuple[int, ...]

    def at(self, nodes: int) -> float:
        return self.a + self.b * math.log2(nodes)

    def describe(self) -> str:
        shapes = ", ".join(str(n) for n in self.points)
        if self.b == 0:
            return f"t(n) = {self.a:.3g} s (perfect weak scaling from {shapes} node{'s' if shapes != '1' else ''})"
        return f"t(n) = {self.a:.3g} s + {self.b:.3g} s x log2(n), fitted to {shapes} nodes"


def fit(points: Mapping[int, float]) -> ScalingModel | None:
    """The scaling model through measured ``points`` (node count -> step seconds); None without points."""
    if not points:
        return None
    nodes = sorted(points)
    if len(nodes) == 1:
        return ScalingModel(points[nodes[0]], 0.0, (nodes[0],))
    xs = [math.log2(n) for n in nodes]
    ys = [points[n] for n in nodes]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else 0.0
    if slope <= 0:
        return ScalingModel(mean_y, 0.0, tuple(nodes))
    return ScalingModel(mean_y - slope * mean_x, slope, tuple(nodes))


def measured_by_nodes(measurements: Sequence[Measurement]) -> dict[int, Measurement]:
    """The best measurement per node count: the one that logged the most steps."""
    best: dict[int, Measurement] = {}
    for found in measurements:
        if found.nodes not in best or found.steps > best[found.nodes].steps:
            best[found.nodes] = found
    return best


def split_model(measurements: Sequence[Measurement]) -> tuple[StepModel, float] | None:
    """The what-if model over the measurements that logged step_split records, and its devices per node (the
    earlier runs share GPUs and tasks per node); None when none did."""
    scaled = [(m.nodes, m.scale) for m in measurements if m.scale is not None and m.scale.step_s > 0]
    if not scaled:
        return None
    nodes, scale = scaled[0]
    return StepModel([s for _, s in scaled]), scale.devices / nodes


def step_times(
    shapes: Sequence[int],
    measurements: Sequence[Measurement],
    *,
    user_step_s: float | None = None,
    user_nodes: int | None = None,
) -> dict[int, StepTime | None]:
    """Each shape's step time, or None where nothing says (no run of this spec, no ``--step-time``)."""
    best = measured_by_nodes(measurements)
    model = fit({n: m.step_s for n, m in best.items()})
    split = split_model(measurements)
    user_model = fit({user_nodes: user_step_s}) if user_step_s is not None and user_nodes is not None else None
    answers: dict[int, StepTime | None] = {}
    for nodes in shapes:
        estimate = split[0].at(max(1, round(nodes * split[1]))) if split is not None else None
        dominant = None if estimate is None else label(estimate.dominant)
        loss = None if estimate is None else estimate.dominant_loss
        if nodes in best:
            found = best[nodes]
            source = (
                f"measured: wall time per step over {found.steps} logged steps (validation and checkpoints "
                f"included) in {found.where}"
                if found.basis == "wall"
                else f"measured: median of {found.steps} logged steps in {found.where}"
            )
            answers[nodes] = StepTime(found.step_s, source, False, "measured", dominant, loss)
        elif user_model is not None and nodes == user_nodes:
            answers[nodes] = StepTime(user_model.at(nodes), "--step-time (yours)", False, "yours")
        elif estimate is not None:
            answers[nodes] = StepTime(
                estimate.step_s, f"extrapolated: {estimate.model}", True, "step split", dominant, loss
            )
        elif model is not None:
            answers[nodes] = StepTime(model.at(nodes), f"extrapolated: {model.describe()}", True, "fit")
        elif user_model is not None:
            answers[nodes] = StepTime(
                user_model.at(nodes), f"extrapolated from your --step-time: {user_model.describe()}", True, "yours"
            )
        else:
            answers[nodes] = None
    return answers
