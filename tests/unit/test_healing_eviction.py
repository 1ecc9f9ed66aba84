"""Slow-node eviction's rule (healing/eviction.py): slowest by the margin, without a break, for the window."""

from __future__ import annotations

from hpctrain.contract.heartbeat_files import Heartbeat
from hpctrain.healing.eviction import NodeSpeed, SlowWatch, node_speeds


def speeds(**ms: float) -> dict[str, NodeSpeed]:
    return {node: NodeSpeed(node, value, 50) for node, value in ms.items()}


def test_a_node_slow_for_the_whole_window_is_evicted_with_its_numbers() -> None:
    watch = SlowWatch(margin=1.5, window_s=60, min_steps=10)
    assert watch.observe(speeds(n1=100, n2=100, n3=300), 3, now=0) is None
    assert watch.observe(speeds(n1=100, n2=105, n3=310), 3, now=59) is None
    slow = watch.observe(speeds(n1=95, n2=100, n3=300), 3, now=61)
    assert slow is not None and slow.node == "n3" and slow.ratio == 300 / 97.5
    assert slow.reason() == "forward 300 ms vs 98 ms on the other nodes (3.1x) for 61 s"


def test_a_break_or_another_slowest_node_starts_the_window_again() -> None:
    watch = SlowWatch(margin=1.5, window_s=60, min_steps=10)
    watch.observe(speeds(n1=100, n2=300), 2, now=0)
    assert watch.observe(speeds(n1=100, n2=120), 2, now=30) is None  # back within the margin
    assert watch.observe(speeds(n1=100, n2=300), 2, now=40) is None
    assert watch.observe(speeds(n1=300, n2=100), 2, now=70) is None  # n1 now, from 70 on
    assert watch.observe(speeds(n1=300, n2=100), 2, now=131) is not None


def test_no_verdict_before_every_node_reports_its_warm_up() -> None:
    watch = SlowWatch(margin=1.5, window_s=0, min_steps=10)
    assert watch.observe(speeds(n1=100, n2=300), 3, now=0) is None  # a node has not reported
    early = {"n1": NodeSpeed("n1", 100, 50), "n2": NodeSpeed("n2", 300, 3)}
    assert watch.observe(early, 2, now=0) is None


def test_a_node_is_its_slowest_rank_of_this_step() -> None:
    beats = [
        Heartbeat(rank=0, node="n1", time=100, compute_time_median_s=0.1, compute_count=30),
        Heartbeat(rank=1, node="n1", time=100, compute_time_median_s=0.3, compute_count=12),
        Heartbeat(rank=2, node="n2", time=100, compute_time_median_s=0.1, compute_count=40),
        Heartbeat(rank=3, node="n3", time=50, compute_time_median_s=0.9, compute_count=40),  # an earlier step
        Heartbeat(rank=4, node="n4", time=100, compute_time_median_s=0.9, compute_count=40),  # not in the step
    ]
    found = node_speeds(beats, ["n1", "n2", "n3"], since=90)
    assert found == {"n1": NodeSpeed("n1", 300.0, 12), "n2": NodeSpeed("n2", 100.0, 40)}
