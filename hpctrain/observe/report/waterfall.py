"""The waterfall: per scale, ideal vs actual step time and the efficiency lost to each part. Pure functions.

A run's split is the mean of its steady ``step_split`` records (``contract/scaling_model.py``):
the first window of every epoch is left out (loader start, warm-up, the ranks arriving
at different times) when the epoch has others. Step times are compared per image
and rank (``step_s x ranks / global batch``), so that a study that changes the
per-rank batch still compares like with like.

* **Scaling bars** (a study, or several runs at two or more scales): the scale
  with the fewest devices is the baseline; at a scale of N devices the
  efficiency is ``t_base / t_N`` (the scaling table's definition, in step time)
  and each part's loss is ``(p_N - p_base) / t_N`` (per image and rank), so the
  losses add up to ``1 - efficiency``. A part that shrank is a gain (negative).
* **Step bars** (every scale, and the only one a single run has): the ideal
  step is its compute (host-to-device copy, forward, backward, optimizer);
  each other part's loss is its share of the step.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from hpctrain.contract.scaling_model import Scale, mean_parts, one_per_scale, ranks_of, usable
from hpctrain.contract.step_split import COMPUTE, LOCAL, PARTS

PERSISTENT = 2 / 3  # a straggler is the slowest rank in at least this share of the steady windows


@dataclass
class Split:
    """One run's steady split (seconds per step, means over its steady windows)."""

    label: str
    devices: int
    device_kind: str
    ranks: int
    global_batch: int | None
    parts: dict[str, float]
    step_s: float
    windows: int
    slowest_rank: int | None = None  # the rank that was slowest in most windows, if it was in PERSISTENT of them
    slowest_windows: int = 0
    slowest_chance: float = 1.0  # how likely that persistence is by chance alone (chance_of_persistence)
    slowest_excess: dict[str, float] = field(default_factory=dict)  # its mean excess per local part (s per step)
    slowest_node: str | None = None
    data_workers: int | None = None
    log_every: int | None = None  # trainer.log_every_steps, when the run's spec says it

    @property
    def per_image(self) -> float:
        """Seconds per step -> seconds per image and rank (1 when the batch is unknown)."""
        return self.ranks / self.global_batch if self.global_batch else 1.0

    @property
    def compute_s(self) -> float:
        return sum(self.parts[p] for p in COMPUTE)

    def scale(self) -> Scale:
        """This split as a measured scale of the what-if model (``contract/scaling_model.py``)."""
        return Scale(self.devices, self.per_image, dict(self.parts), self.windows)


@dataclass
class Loss:
    part: str  # a PARTS name, or "compute" (scaling bars: the compute parts together)
    fraction: float  # of the actual step time
    seconds: float  # per step at this scale (for scaling bars: the growth over the baseline, at this scale's batch)


@dataclass
class Bar:
    label: str
    devices: int
    device_kind: str
    kind: str  # "scaling" or "step"
    actual_s: float  # seconds per step
    ideal_s: float
    efficiency: float
    losses: list[Loss]  # largest first; gains (negative) last

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def count_text(number: int, kind: str) -> str:
    """``4 processes``, ``1 GPU``."""
    return f"{number} {kind}" + ("" if number == 1 else "es" if kind.endswith("s") else "s")


def run_split(
    label: str,
    records: list[dict[str, Any]],
    *,
    devices: int | None,
    device_kind: str = "process",
    global_batch: int | None = None,
    nodes_of_ranks: dict[int, str] | None = None,
    data_workers: int | None = None,
    log_every: int | None = None,
) -> Split | None:
    """A run's steady split from its step_split records; None without any."""
    steady = usable(records)
    if not steady:
        return None
    parts = mean_parts(steady)
    ranks = ranks_of(steady)
    split = Split(
        label=label,
        devices=devices or ranks,
        device_kind=device_kind,
        ranks=ranks,
        global_batch=global_batch,
        parts=parts,
        step_s=sum(parts.values()),
        windows=len(steady),
        data_workers=data_workers,
        log_every=log_every,
    )
    slowest = Counter(r.get("slowest_rank") for r in steady if isinstance(r.get("slowest_rank"), int))
    if ranks > 1 and slowest:
        rank, count = slowest.most_common(1)[0]
        if count >= PERSISTENT * len(steady):
            mine = [r for r in steady if r.get("slowest_rank") == rank]
            split.slowest_rank, split.slowest_windows = rank, count
            split.slowest_chance = chance_of_persistence(ranks, len(steady), count)
            split.slowest_excess = {p: statistics.fmean(_num(r.get(f"slowest_{p}_s")) for r in mine) for p in LOCAL}
            split.slowest_node = (nodes_of_ranks or {}).get(rank)
    return split


def chance_of_persistence(ranks: int, windows: int, count: int) -> float:
    """How likely some rank is the slowest in ``count`` or more of ``windows`` with no slow rank at all (each
    window's slowest any of ``ranks`` alike). Exact when ``count`` is over half the windows (no two ranks can
    both be; PERSISTENT asks for that), an upper bound otherwise. Pure.

    With 3 ranks, the same rank is the slowest in 2 of 2 windows one time in three by chance; in 4 of 4 one
    time in 27; with 64 ranks in 9 of 10, never in practice."""
    if ranks <= 1 or windows <= 0:
        return 1.0
    p = 1.0 / ranks
    tail = sum(math.comb(windows, k) * p**k * (1 - p) ** (windows - k) for k in range(max(count, 0), windows + 1))
    return min(1.0, ranks * tail)


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and value >= 0 else 0.0


def step_bar(split: Split) -> Bar:
    """Ideal: the compute alone; every other part is a loss (its share of the step)."""
    losses = [Loss(p, split.parts[p] / split.step_s, split.parts[p]) for p in PARTS if p not in COMPUTE]
    return _bar(split, "step", split.compute_s, losses)


def scaling_bar(split: Split, base: Split) -> Bar:
    """Ideal: the baseline's step time per image and rank, at this scale's batch; losses: what grew."""
    scale = split.per_image
    to_here = base.per_image / scale  # baseline seconds (per its step) -> seconds per this scale's step
    grown = {p: split.parts[p] - base.parts[p] * to_here for p in PARTS if p not in COMPUTE}
    grown["compute"] = split.compute_s - base.compute_s * to_here
    ideal = base.step_s * to_here
    losses = [Loss(p, s / split.step_s, s) for p, s in grown.items()]
    return _bar(split, "scaling", ideal, losses)


def _bar(split: Split, kind: str, ideal_s: float, losses: list[Loss]) -> Bar:
    """``split``'s bar of ``kind`` against ``ideal_s``, its losses largest first."""
    return Bar(
        label=split.label,
        devices=split.devices,
        device_kind=split.device_kind,
        kind=kind,
        actual_s=split.step_s,
        ideal_s=ideal_s,
        efficiency=ideal_s / split.step_s,
        losses=_ordered(losses),
    )


def _ordered(losses: list[Loss]) -> list[Loss]:
    return sorted(losses, key=lambda loss: -loss.fraction)


def by_scale(splits: list[Split]) -> list[Split]:
    """One split per number of devices (the one with the most windows), fewest devices first."""
    return one_per_scale(splits)


def waterfall(splits: list[Split]) -> list[Bar]:
    """Every scale's step bar, and from two scales on, every larger scale's scaling bar (fewest devices first)."""
    scales = by_scale(splits)
    bars = []
    for split in scales:
        bars.append(step_bar(split))
        if len(scales) > 1 and split is not scales[0]:
            bars.append(scaling_bar(split, scales[0]))
    return bars
