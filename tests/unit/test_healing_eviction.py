"""Slow-node eviction's rule (healing/eviction.py): slowest by the margin, without a break, for the window."""

from __future__ import annotations

import random

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


def test_noisy_healthy_step_times_never_evict() -> None:
    """Four healthy nodes, each step's own compute 30 ms +- 40 % with a spike of 5x every tenth step: the
    medians stay within the margin, so no node is named in ten minutes of heartbeats."""
    rng = random.Random(42)
    watch = SlowWatch(margin=1.5, window_s=30, min_steps=10)
    recent: dict[str, list[float]] = {f"n{i}": [] for i in range(4)}
    for second in range(600):
        for times in recent.values():
            sample = 0.03 * rng.uniform(0.6, 1.4) * (5 if rng.random() < 0.1 else 1)
            times[:] = [*times, sample][-20:]
        beats = [
            Heartbeat(
                rank=i,
                node=node,
                time=second,
                recent_compute_times_s=times,
                compute_count=second + 1,
                compute_kind="step",
            )
            for i, (node, times) in enumerate(recent.items())
        ]
        assert watch.observe(node_speeds(beats, list(recent), since=second), 4, now=second) is None


def test_one_kind_is_compared_and_an_older_heartbeat_is_a_forward() -> None:
    beats = [
        Heartbeat(rank=0, node="n1", time=100, compute_time_median_s=0.1, compute_count=30, compute_kind="step"),
        Heartbeat(rank=1, node="n2", time=100, compute_time_median_s=0.1, compute_count=30, compute_kind="step"),
        Heartbeat(rank=2, node="n3", time=100, compute_time_median_s=0.02, compute_count=30),  # forward: left out
    ]
    assert set(node_speeds(beats, ["n1", "n2", "n3"], since=0)) == {"n1", "n2"}
    older = Heartbeat.model_validate({"rank": 0, "node": "n1", "compute_time_median_s": 0.1, "compute_count": 3})
    [speed] = node_speeds([older], ["n1"], since=0).values()
    assert older.compute_kind is None and speed.kind == "forward"


def test_the_evidence_says_what_was_measured() -> None:
    slow = SlowWatch(margin=1.5, window_s=0, min_steps=1).observe(
        {"n1": NodeSpeed("n1", 100, 5, "step"), "n2": NodeSpeed("n2", 400, 5, "step")}, 2, now=0
    )
    assert slow is not None and slow.evidence() == {
        "compute_ms": 400,
        "compute_kind": "step",
        "others_ms": 100,
        "ratio": 4.0,
        "slow_for_s": 0,
    }
