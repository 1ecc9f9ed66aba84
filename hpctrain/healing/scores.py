"""Which node is worse than the others: the burn-in's robust margin. Pure and torch-free.

Every probe gives each node one number (``healing/probes.py``): compute
milliseconds per pass, pairwise all-reduce MB/s, read MB/s. Each is turned
into a cost (higher is worse: a time, or seconds per MB for a rate) and each
node is compared with the *other* nodes (leave-one-out, so one sick node does
not move the yardstick it is measured by):

    flagged  <=>  cost > margin x m   and   cost > m + mad_k x 1.4826 x MAD

where ``m`` is the median of the other nodes' costs and ``MAD`` their median
absolute deviation from ``m`` (1.4826 x MAD estimates a standard deviation
for normal noise). The margin alone decides when the others agree exactly
(MAD 0); the MAD term keeps a noisy cluster from flagging its slowest node
by chance. Two nodes cannot outvote each other: there the margin is at least
:data:`TWO_NODE_MARGIN` (2x). From three nodes on, a probe flags a strict
minority of the nodes or none: half the nodes worse than the other half is a
split, not an outlier, and which half is "worse" is then the noise's choice.
The loaded test machine showed it after an eviction: the pairwise all-reduce
of two healthy nodes of four ran 2.1x and 2.6x below the other two in both
passes, and acting on it requeued the run without three of its five nodes.
Two sick nodes of four therefore pass the burn-in; the eviction during
training (``healing/eviction.py``) still sees a node that trains slowly. A
flagged run is measured again (``healing/burn_in.py``). GPU checks (count,
ECC, clocks) flag a node outright (:func:`gpu_flags`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAD_SCALE = 1.4826
TWO_NODE_MARGIN = 2.0  # two nodes cannot outvote each other: the slower is flagged only when clearly so


@dataclass(frozen=True)
class Probe:
    """How one probe's numbers read: its name in reasons, its unit, and whether more is better."""

    name: str
    unit: str
    higher_is_better: bool


COMPUTE = Probe("compute", "ms per pass", higher_is_better=False)
ALLREDUCE = Probe("pairwise all-reduce", "MB/s", higher_is_better=True)
READ = Probe("read", "MB/s", higher_is_better=True)


@dataclass(frozen=True)
class Outlier:
    node: str
    probe: Probe
    value: float  # the node's own number, in the probe's unit
    others: float  # the median of the other nodes' numbers
    factor: float  # how many times worse

    def reason(self) -> str:
        """``compute 412 ms per pass vs 150 on the other nodes (2.7x worse)``."""
        return (
            f"{self.probe.name} {_fmt(self.value)} {self.probe.unit} vs {_fmt(self.others)} on the other nodes "
            f"({self.factor:.1f}x worse)"
        )


def _fmt(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _cost(value: float, probe: Probe) -> float:
    if not probe.higher_is_better:
        return value
    return 1.0 / value if value > 0 else float("inf")


def robust_outliers(values: Mapping[str, float], probe: Probe, *, margin: float, mad_k: float) -> list[Outlier]:
    """The nodes of ``values`` (node -> number) worse than the others by the robust margin; needs two nodes."""
    costs = {node: _cost(value, probe) for node, value in values.items() if value is not None and value >= 0}
    if len(costs) < 2:
        return []
    if len(costs) == 2:
        margin = max(margin, TWO_NODE_MARGIN)
    found = []
    for node, cost in costs.items():
        others = [c for other, c in costs.items() if other != node]
        middle = statistics.median(others)
        mad = statistics.median(abs(c - middle) for c in others)
        if middle <= 0 or cost == float("inf") and middle == float("inf"):
            continue
        if cost > margin * middle and cost > middle + mad_k * MAD_SCALE * mad:
            typical = statistics.median(v for other, v in values.items() if other != node)
            factor = cost / middle if middle > 0 else float("inf")
            found.append(Outlier(node, probe, values[node], typical, factor))
    if len(costs) >= 3 and 2 * len(found) >= len(costs):
        return []  # a split, not an outlier (module docstring)
    return found


def gpu_flags(problems: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """Nodes whose GPU checks found problems -> ``GPU: <problems>``."""
    return {node: "GPU: " + "; ".join(found) for node, found in problems.items() if found}


def flag_nodes(
    compute_ms: Mapping[str, float],
    allreduce_mb_s: Mapping[str, float],
    read_mb_s: Mapping[str, float],
    gpu_problems: Mapping[str, Sequence[str]],
    *,
    margin: float,
    mad_k: float,
    network_margin: float | None = None,
) -> dict[str, str]:
    """node -> why it is flagged (its reasons joined), for every node any probe or GPU check flags.
    ``network_margin`` (default: ``margin``) is the all-reduce's factor."""
    reasons: dict[str, list[str]] = {}
    for node, why in gpu_flags(gpu_problems).items():
        reasons.setdefault(node, []).append(why)
    link_margin = margin if network_margin is None else network_margin
    checks = ((compute_ms, COMPUTE, margin), (allreduce_mb_s, ALLREDUCE, link_margin), (read_mb_s, READ, margin))
    for values, probe, factor in checks:
        for outlier in robust_outliers(values, probe, margin=factor, mad_k=mad_k):
            reasons.setdefault(outlier.node, []).append(outlier.reason())
    return {node: "; ".join(why) for node, why in reasons.items()}


def pair_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint node pairs for the pairwise all-reduce: (0,1),(2,3)...; then (1,2),(3,4)...; the
    ring closed by (n-1,0), in the second round for an even count, in a third for an odd one.

    Each node meets two different partners (three nodes or more), so a bad link is pinned on the node
    it is bad with in every pair, as DLRover's network check pins it. A node's score is its best pair.
    """
    if count < 2:
        return []
    first = [(i, i + 1) for i in range(0, count - 1, 2)]
    if count == 2:
        return [first]
    second = [(i, i + 1) for i in range(1, count - 1, 2)]
    if count % 2 == 0:
        return [first, [*second, (count - 1, 0)]]
    return [first, second, [(count - 1, 0)]]
