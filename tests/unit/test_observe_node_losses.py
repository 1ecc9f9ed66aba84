"""The lines status, watch and report print about a run's nodes (observe/node_losses.py)."""

from __future__ import annotations

from hpctrain.observe.node_losses import burn_in_text, evictions_text, node_loss_text

SCORES = [
    {"node": "n1", "compute_ms": 150.0, "allreduce_mb_s": 980.0, "read_mb_s": 310.0},
    {"node": "n3", "compute_ms": 412.0, "allreduce_mb_s": 990.0, "flagged": True, "reason": "compute 412 ms\x1b[31m"},
]


def test_the_last_burn_in_shows_each_node_and_who_was_flagged() -> None:
    text = burn_in_text(
        [{"seconds": 1}, {"seconds": 6.2, "nodes": ["n1", "n3"], "scores": SCORES, "flagged": ["n3"], "action": "swap"}]
    )
    assert text == (
        "6.2 s, 2 nodes (compute ms / pair MB/s / read MB/s): n1 150/980/310, n3 412/990/-; "
        "flagged n3: compute 412 ms\\x1b[31m -> swap"
    )
    assert burn_in_text(None) is None and burn_in_text(["junk", {"scores": "no"}]) is None


def test_evictions_and_node_events_name_the_kind_and_what_was_done() -> None:
    evicted = [
        {
            "node": "n3",
            "step": 12,
            "node_ms": 410,
            "others_ms": 150,
            "ratio": 2.73,
            "slow_for_s": 10,
            "action": "swap",
            "nodes": ["n1", "n2", "n5"],
        }
    ]
    assert evictions_text(evicted) == (
        "n3 at step 12 (forward 410 ms vs 150 ms, 2.73x, slow for 10 s): swapped for a spare, training on n1,n2,n5"
    )  # a record from before compute_kind: the forward
    assert evictions_text([{**evicted[0], "compute_kind": "step"}]) == (
        "n3 at step 12 (step compute 410 ms vs 150 ms, 2.73x, slow for 10 s): swapped for a spare, training on n1,n2,n5"
    )
    events = [
        {"node": "n3", "kind": "slow", "step": 12, "reason": "forward 3x", "action": "swap", "nodes": ["n1"]},
        {"node": "n2", "reason": "its slurmd does not answer", "action": "continue"},
    ]
    assert (
        node_loss_text(events) == "n3 slow at step 12 (forward 3x): swapped for a spare, training on n1; "
        "n2 (its slurmd does not answer): continue"
    )
