"""From the waterfall to causes named with what to try, and a prediction at the next scales. Pure functions.

A cause is named only from evidence: a loss of at least :data:`MIN_LOSS` of the
step time at the largest measured scale (its scaling bar when there are two
scales or more, else its step bar), each hint quoting the numbers it rests on.
Exposed communication is named a **slow link** on a node only from the run's
burn-in (``links.py``: that node's best pairwise all-reduce well below the
other nodes'); without one the hint quotes what the burn-in measured, if it
ran, and names no node.
A straggler is named only when one rank was the slowest in most steady windows
(``waterfall.PERSISTENT``) and by at least :data:`MIN_STRAGGLER_EXCESS` of the
typical rank's own work; random jitter between ranks moves from rank to rank
and stays a part of the wait, unnamed. And only when that persistence is
evidence: chance alone would give it at most :data:`CHANCE` of the time
(``waterfall.chance_of_persistence``: the run's own number of ranks and
windows), or the rank's own work took at least :data:`STRONG_STRAGGLER_EXCESS`
more than the typical rank's (twice the time: no jitter between ranks of one
run does that). A short run on uneven shared cores (3 ranks, 2 windows: the
same rank the slowest in both one time in three) names no straggler at +30-45 %.

What-if (:func:`predict`): the step at 2x and 4x the largest measured scale
from the one model ``hpctrain plan`` uses too (``contract/scaling_model.py``:
the rank's own work per image as measured at the largest scale, exposed
communication on a line in log2(devices) through the two largest), with the
largest scale's per-rank batch (weak scaling).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hpctrain.contract.scaling_model import Estimate, StepModel
from hpctrain.contract.step_split import LABELS, LOCAL
from hpctrain.observe.report.links import LinkEvidence
from hpctrain.observe.report.waterfall import Bar, Split, by_scale, count_text

MIN_LOSS = 0.10  # a part must cost at least this share of the step to be named a cause
MIN_STRAGGLER_EXCESS = 0.30  # the slowest rank's extra local work, as a share of the typical rank's
CHANCE = 0.05  # a straggler's persistence must be at most this likely by chance (the usual significance level)...
STRONG_STRAGGLER_EXCESS = 1.0  # ...unless its own work took this much more than the typical rank's (twice)
FACTORS = (2, 4)  # what-if scales: these times the largest measured


@dataclass
class Cause:
    part: str
    loss: float  # share of the step time at the scale it was found
    where: str  # the scale's label
    evidence: str  # the numbers
    hint: str  # what to try
    nodes: list[str] = field(default_factory=list)  # the nodes it is pinned on (a straggler, a slow link)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        return f"{self.evidence} -> {self.hint}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.0f} %"


def _comm_growth(scales: list[Split]) -> str:
    points = [(s.devices, s.parts["comm"]) for s in scales]  # per step: the gradients' size is the model's
    if len(points) < 2:
        return ""
    (d0, c0), (d1, c1) = points[0], points[-1]
    return f"it grew from {_ms(c0)} at {d0} to {_ms(c1)} at {count_text(d1, scales[-1].device_kind)}; "


def _evidence(part: str, loss: float, seconds: float, split: Split, scaling: bool) -> str:
    what = "more than at the baseline" if scaling else "per step"
    scale = count_text(split.devices, split.device_kind)
    return f"{LABELS.get(part, part)} {_ms(seconds)} {what} at {scale} ({_pct(loss)} of the step)"


def _hint(part: str, split: Split, scales: list[Split]) -> str | None:
    if part == "data":
        workers = f" (now {split.data_workers})" if split.data_workers is not None else ""
        return (
            f"the input pipeline cannot keep up: measure it with `hpctrain bench-data`, raise data.workers"
            f"{workers}, or read a packed image (`hpctrain pack`, docs/data.md)"
        )
    if part == "comm":
        return (
            f"{_comm_growth(scales)}the backward does not hide the all-reduce: try larger "
            "DDP buckets (bucket_cap_mb), gradient compression (a DDP comm hook such as fp16_compress_hook), "
            "or fewer, larger nodes (more of the all-reduce stays inside a node)"
        )
    if part == "checkpoint":
        return (
            "checkpoints stall the steps: set checkpoint.async_save: true, or save less often (checkpoint.every_steps)"
        )
    if part == "log":
        every = f" (now every {split.log_every} steps)" if split.log_every else ""
        return (
            "rank 0's writes of each log line (metrics.jsonl, TensorBoard, a tracker's queue) hold up every rank: "
            f"log less often (trainer.log_every_steps{every}), or write output_dir to a faster file system"
        )
    if part == "other":
        return "the loop itself (callbacks, your own code between the steps) takes this long"
    if part == "compute":
        return (
            "each rank's own compute per image grew with the scale: look for synchronised BatchNorm, a smaller "
            "per-rank batch (less efficient kernels), or slower nodes in the larger allocation"
        )
    return None


def _straggler(split: Split, loss: float, where: str) -> Cause | None:
    if split.slowest_rank is None:
        return None
    typical = sum(split.parts[p] for p in LOCAL)
    excess = sum(split.slowest_excess.values())
    if typical <= 0 or excess < MIN_STRAGGLER_EXCESS * typical:
        return None
    if split.slowest_chance > CHANCE and excess < STRONG_STRAGGLER_EXCESS * typical:
        return None  # as persistent as chance makes jitter, and not slow beyond any jitter
    worst = max(split.slowest_excess, key=split.slowest_excess.__getitem__)
    node = split.slowest_node or "its node"
    evidence = (
        f"straggler {split.slowest_node or f'rank {split.slowest_rank}'}: rank {split.slowest_rank} was the slowest "
        f"in {split.slowest_windows} of {split.windows} windows, {_ms(excess)} per step behind the typical rank "
        f"(+{_pct(excess / typical)}, most in its {LABELS[worst]}: +{_ms(split.slowest_excess[worst])}); "
        f"the others waited {_ms(split.parts['straggler'])} per step ({_pct(loss)} of the step)"
    )
    hint = (
        f"check {node} (`hpctrain nodes`, its burn-in scores in docs/node-health.md), leave it out of the "
        "allocation (--exclude) or let slow-node eviction (health.eviction) replace it"
    )
    return Cause("straggler", loss, where, evidence, hint, [split.slowest_node] if split.slowest_node else [])


def _slow_link(loss: float, seconds: float, split: Split, where: str, scaling: bool, link: LinkEvidence) -> Cause:
    nodes = ", ".join(link.slow)
    evidence = f"slow link {nodes}: {_evidence('comm', loss, seconds, split, scaling)}; {link.text()}"
    hint = (
        f"every rank's all-reduce runs at the pace of the slowest link: check {nodes}'s network interface, cable "
        f"and switch port (its burn-in scores: `hpctrain nodes`), or leave it out of the allocation (--exclude {nodes})"
    )
    return Cause("link", loss, where, evidence, hint, list(link.slow))


def causes(bars: list[Bar], splits: list[Split], links: Mapping[str, LinkEvidence] | None = None) -> list[Cause]:
    """The causes at the largest scale, largest loss first; empty when no part costs MIN_LOSS.

    ``links``: a split's label -> what its run's burn-in said about the links (``links.py``)."""
    scales = by_scale(splits)
    if not scales or not bars:
        return []
    top = scales[-1]
    bar = next((b for b in reversed(bars) if b.devices == top.devices), bars[-1])
    found = []
    for loss in bar.losses:
        if loss.fraction < MIN_LOSS:
            break
        link = (links or {}).get(top.label)
        if loss.part == "straggler":
            cause = _straggler(top, loss.fraction, bar.label)
        elif loss.part == "comm" and link is not None and link.slow:
            cause = _slow_link(loss.fraction, loss.seconds, top, bar.label, bar.kind == "scaling", link)
        else:
            hint = _hint(loss.part, top, scales)
            scaling = bar.kind == "scaling"
            evidence = _evidence(loss.part, loss.fraction, loss.seconds, top, scaling)
            if loss.part == "comm" and link is not None:
                evidence += f"; {link.text()}"
            cause = Cause(loss.part, loss.fraction, bar.label, evidence, hint) if hint else None
        if cause is not None:
            found.append(cause)
    return found


@dataclass
class Prediction:
    devices: int
    device_kind: str
    efficiency: float
    dominant: str  # the part losing the most there
    dominant_loss: float
    model: str
    step_s: float  # the predicted step time (seconds), as ``hpctrain plan`` would give it

    @classmethod
    def of(cls, estimate: Estimate, device_kind: str) -> Prediction:
        return cls(
            estimate.devices,
            device_kind,
            estimate.efficiency,
            estimate.dominant,
            estimate.dominant_loss,
            estimate.model,
            estimate.step_s,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(splits: list[Split], factors: tuple[int, ...] = FACTORS) -> list[Prediction]:
    """The step at ``factors`` x the largest measured scale, with its per-rank batch; [] with one scale."""
    scales = by_scale(splits)
    if len(scales) < 2:
        return []
    top = scales[-1]
    model = StepModel([s.scale() for s in scales], kind=count_text(2, top.device_kind).split(" ", 1)[1])
    return [Prediction.of(model.at(top.devices * factor), top.device_kind) for factor in factors]
