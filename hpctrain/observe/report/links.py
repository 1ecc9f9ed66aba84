"""Which link makes the all-reduce slow: the burn-in's pairwise rates, read beside the exposed communication. Pure.

A step cannot say which link its all-reduce waited for: with one slow link the
ring (or tree) runs at that link's pace on every rank, so the waterfall shows
*exposed communication* growing on all of them alike, not one straggler. What
can tell is the burn-in (``healing/probes.py``): it all-reduces between pairs of
nodes, each node meeting two partners from three nodes on
(``healing/scores.pair_rounds``), and records each node's *best* pair as its
``allreduce_mb_s`` (``contract/node_records.NodeScore``). A node whose link is
slow is slow in every pair it is in, so its best pair is slow too, while every
other node has a fast pair left. From these numbers :func:`slow_links` names:

* **nodes** whose best pairwise rate is :data:`LINK_FACTOR` times or more
  below the median of the other nodes' (a strict minority of them, as the
  burn-in's own scoring requires: half the nodes slower than the other half
  is a split, not a bad link), from three nodes with a rate on;
* with **two nodes**, only their one pair's rate: both ends share it, so it
  says how fast the link between them ran, never which end is slow.

A pairwise rate is measured by the hosts as much as by the link between them:
a node whose CPU is starved (or whose GPU is throttled) all-reduces slowly
over a perfect link (gloo's transfers are CPU work). A node whose burn-in
compute was also :data:`HOST_FACTOR` times the other nodes' median or more is
therefore not named a slow link; the text says its host was slow too (the
straggler, if the steps show one, is then the cause to act on).

The report (``causes.py``) quotes these only where exposed communication is a
loss worth naming; it never names a link without a burn-in that measured it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hpctrain.contract.node_records import BURN_IN_KEY, BurnIn, records
from hpctrain.errors import printable

LINK_FACTOR = 2.0  # the burn-in's default network_margin: healthy links differ by less, a degraded one by more
HOST_FACTOR = 1.5  # the burn-in's default compute margin: a node this much slower in compute is a slow host
MAX_NODES = 4096  # scores read from one burn-in record (summary.json is untrusted input)


@dataclass
class LinkEvidence:
    """What the run's latest burn-in says about its links."""

    rates_mb_s: dict[str, float]  # node -> its best pairwise all-reduce rate
    slow: list[str] = field(default_factory=list)  # the nodes whose link is slow (empty: none, or cannot tell)
    others_mb_s: float | None = None  # the median of the other nodes' rates (when ``slow`` names nodes)
    slow_hosts: dict[str, float] = field(default_factory=dict)  # slow pairs, but compute too: node -> x others'

    @property
    def pair_only(self) -> bool:
        """Two nodes: one pair, whose rate both ends share."""
        return len(self.rates_mb_s) == 2

    def text(self) -> str:
        """``in the burn-in, m2's best pairwise all-reduce ran at 2.3 MB/s against 24 MB/s on the other nodes``."""
        if self.slow:
            who = ", ".join(self.slow)
            rates = ", ".join(_mb(self.rates_mb_s[n]) for n in self.slow)
            factor = max(self.others_mb_s / self.rates_mb_s[n] for n in self.slow) if self.others_mb_s else 0.0
            return (
                f"in the burn-in, {who}'s best pairwise all-reduce ran at {rates} against {_mb(self.others_mb_s)} "
                f"on the other nodes ({factor:.1f}x slower)"
            )
        if self.slow_hosts:
            hosts = ", ".join(
                f"{n}'s at {_mb(self.rates_mb_s[n])} (compute {f:.1f}x)" for n, f in self.slow_hosts.items()
            )
            return (
                f"in the burn-in, the pairwise all-reduce was slow ({hosts}) but so was the compute, against the "
                "other nodes' median: a slow host, not only a slow link"
            )
        if self.pair_only:
            a, b = sorted(self.rates_mb_s)
            rate = min(self.rates_mb_s.values())
            return (
                f"the burn-in all-reduced between {a} and {b} at {_mb(rate)}; with two nodes it cannot tell which "
                "end's link is slow"
            )
        low, high = min(self.rates_mb_s.values()), max(self.rates_mb_s.values())
        return (
            f"the burn-in's pairwise all-reduce ran at {_mb(low)} to {_mb(high)} on the {len(self.rates_mb_s)} "
            "nodes: no node's link stands out"
        )


def _mb(value: float | None) -> str:
    if value is None:
        return "? MB/s"
    return f"{value:.0f} MB/s" if value >= 10 else f"{value:.2g} MB/s"


def latest_rates(summary: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(node -> best pairwise all-reduce MB/s, node -> compute ms per pass) of the latest burn-in that measured
    two nodes' rates or more; two empty maps without one."""
    for burn_in in reversed(records(BurnIn, summary.get(BURN_IN_KEY))):
        scores = burn_in.scores[:MAX_NODES]
        rates = {printable(s.node): s.allreduce_mb_s for s in scores if s.allreduce_mb_s and s.allreduce_mb_s > 0}
        if len(rates) >= 2:
            return rates, {printable(s.node): s.compute_ms for s in scores if s.compute_ms and s.compute_ms > 0}
    return {}, {}


def slow_links(
    rates_mb_s: Mapping[str, float],
    trained_on: set[str] | None = None,
    compute_ms: Mapping[str, float] | None = None,
) -> LinkEvidence | None:
    """The evidence from one burn-in's rates (node -> MB/s); None without two nodes' rates.

    ``trained_on``: the nodes the measured steps ran on, when known; a slow node outside them (the run left it
    behind after the burn-in) is not named. ``compute_ms``: the same burn-in's compute per pass, node -> ms; a
    slow node whose compute was slow too is a slow host (``slow_hosts``), not a slow link.
    """
    rates = {node: float(rate) for node, rate in rates_mb_s.items() if rate > 0}
    if len(rates) < 2:
        return None
    evidence = LinkEvidence(rates)
    if len(rates) < 3:
        return evidence
    slow = []
    for node, rate in rates.items():
        others = statistics.median(r for other, r in rates.items() if other != node)
        if others >= LINK_FACTOR * rate:
            slow.append(node)
    if not slow or 2 * len(slow) >= len(rates):
        return evidence
    if trained_on is not None and not set(slow) <= trained_on:
        return evidence
    hosts = _slow_hosts(slow, compute_ms or {})
    if hosts:
        evidence.slow_hosts = hosts
        return evidence
    evidence.slow = sorted(slow, key=rates.__getitem__)
    evidence.others_mb_s = statistics.median(r for node, r in rates.items() if node not in slow)
    return evidence


def _slow_hosts(nodes: list[str], compute_ms: Mapping[str, float]) -> dict[str, float]:
    """Those of ``nodes`` whose compute was HOST_FACTOR times the other nodes' median or more -> that factor."""
    found = {}
    for node in nodes:
        others = [ms for other, ms in compute_ms.items() if other != node and ms > 0]
        if node in compute_ms and others and compute_ms[node] >= HOST_FACTOR * statistics.median(others):
            found[node] = compute_ms[node] / statistics.median(others)
    return found
