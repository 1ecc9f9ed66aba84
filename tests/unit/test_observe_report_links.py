"""A slow link named from the burn-in's pairwise rates (cases of their own: a GPU cluster's InfiniBand rates on
8 to 16 nodes, not the Slurm test bed's two or three CPU nodes)."""

from __future__ import annotations

from typing import Any

import pytest

from hpctrain.contract.step_split import LOCAL, PARTS
from hpctrain.observe.report.causes import causes
from hpctrain.observe.report.explain import Explanation, summary_line
from hpctrain.observe.report.links import LINK_FACTOR, latest_rates, slow_links
from hpctrain.observe.report.waterfall import run_split, waterfall

COMPUTE = {"h2d": 0.002, "forward": 0.020, "backward": 0.040, "optimizer": 0.004}
HEALTHY = {f"ib{i:02d}": 11800.0 + 37 * i for i in range(1, 9)}  # MB/s, best pair of each node


def window(step: int, **parts: float) -> dict[str, Any]:
    values = {p: 0.0 for p in PARTS} | COMPUTE | parts
    record: dict[str, Any] = {"kind": "step_split", "global_step": step, "epoch": 0, "attempt": 0, "ranks": 64}
    record |= {f"{p}_s": v for p, v in values.items()} | {"step_s": sum(values.values())}
    return record | {"slowest_rank": step // 10 % 64} | {f"slowest_{p}_s": 0.0 for p in LOCAL}


def one_run(comm_s: float) -> list:
    return [run_split("64gpu", [window(s, comm=comm_s) for s in range(10, 70, 10)], devices=64, device_kind="GPU")]


def test_a_node_slow_in_all_its_pairs_is_named_against_the_others_median() -> None:
    rates = HEALTHY | {"ib05": 1450.0}
    link = slow_links(rates)
    assert link is not None and link.slow == ["ib05"]
    assert link.others_mb_s == pytest.approx(sorted(r for n, r in rates.items() if n != "ib05")[3])
    expected = "ib05's best pairwise all-reduce ran at 1450 MB/s against 11948 MB/s on the other nodes (8.2x slower)"
    assert expected in link.text()


def test_links_within_the_factor_of_each_other_name_no_node() -> None:
    rates = HEALTHY | {"ib05": HEALTHY["ib05"] / (LINK_FACTOR * 0.9)}
    link = slow_links(rates)
    assert link is not None and link.slow == []
    assert "no node's link stands out" in link.text()


def test_half_the_nodes_slower_than_the_other_half_is_a_split_not_a_bad_link() -> None:
    rates = {n: (r if i % 2 else r / 4) for i, (n, r) in enumerate(HEALTHY.items())}
    assert slow_links(rates).slow == []  # type: ignore[union-attr]


def test_two_nodes_share_their_one_pair_and_neither_end_is_named() -> None:
    link = slow_links({"ib02": 350.0, "ib01": 350.0})
    assert link is not None and link.slow == [] and link.pair_only
    assert link.text() == (
        "the burn-in all-reduced between ib01 and ib02 at 350 MB/s; with two nodes it cannot tell which end's link "
        "is slow"
    )
    assert slow_links({"ib01": 350.0}) is None


def test_a_slow_node_the_run_no_longer_trains_on_is_not_named() -> None:
    rates = HEALTHY | {"ib05": 900.0}
    assert slow_links(rates, trained_on=set(HEALTHY) - {"ib05"}).slow == []  # type: ignore[union-attr]
    assert slow_links(rates, trained_on=set(HEALTHY)).slow == ["ib05"]  # type: ignore[union-attr]


def test_a_node_slow_in_its_pairs_and_in_its_compute_is_a_slow_host_not_a_slow_link() -> None:
    compute = {node: 40.0 + i for i, node in enumerate(HEALTHY)}
    rates = HEALTHY | {"ib05": 1450.0}
    assert slow_links(rates, compute_ms=compute).slow == ["ib05"]  # type: ignore[union-attr]
    link = slow_links(rates, compute_ms=compute | {"ib05": 130.0})
    assert link is not None and link.slow == [] and link.slow_hosts == {"ib05": pytest.approx(130 / 43)}
    assert link.text() == (
        "in the burn-in, the pairwise all-reduce was slow (ib05's at 1450 MB/s (compute 3.0x)) but so was the "
        "compute, against the other nodes' median: a slow host, not only a slow link"
    )


def test_the_latest_burn_in_with_rates_counts_and_junk_entries_are_skipped() -> None:
    older = {"scores": [{"node": n, "allreduce_mb_s": r} for n, r in HEALTHY.items()]}
    newer = {"scores": [{"node": "ib\x1b[31m01", "allreduce_mb_s": 900.0}, {"node": "ib02", "allreduce_mb_s": 12e3}]}
    single = {"scores": [{"node": "ib03", "allreduce_mb_s": 12e3}, {"node": "ib04", "allreduce_mb_s": None}]}
    summary = {"burn_in": [older, "junk", {"scores": "junk"}, newer, single, 7]}
    assert latest_rates(summary) == ({"ib\\x1b[31m01": 900.0, "ib02": 12e3}, {})
    assert latest_rates({"burn_in": "junk"}) == latest_rates({}) == ({}, {})
    newer["scores"][1]["compute_ms"] = 41.5
    assert latest_rates(summary)[1] == {"ib02": 41.5}


def test_exposed_communication_with_a_slow_link_is_named_on_its_node_with_both_numbers() -> None:
    splits = one_run(comm_s=0.090)
    bars = waterfall(splits)
    found = causes(bars, splits, {"64gpu": slow_links(HEALTHY | {"ib05": 1450.0})})  # type: ignore[dict-item]
    assert [(c.part, c.nodes) for c in found] == [("link", ["ib05"])]
    assert found[0].evidence.startswith("slow link ib05: exposed communication 90.0 ms per step at 64 GPUs (58 %")
    assert "ib05's best pairwise all-reduce ran at 1450 MB/s" in found[0].evidence
    assert "--exclude ib05" in found[0].hint
    line = summary_line(bars[0], splits, found)
    assert "exposed communication (slow link ib05) 58 %" in line
    assert Explanation(splits, bars, found).as_dict()["causes"][0]["nodes"] == ["ib05"]


def test_without_a_node_to_blame_the_hint_quotes_the_burn_in_and_names_no_node() -> None:
    splits = one_run(comm_s=0.090)
    bars = waterfall(splits)
    for link in (slow_links({"ib01": 350.0, "ib02": 350.0}), slow_links(HEALTHY)):
        found = causes(bars, splits, {"64gpu": link})  # type: ignore[dict-item]
        assert [(c.part, c.nodes) for c in found] == [("comm", [])]
        assert link is not None and found[0].evidence.endswith(link.text())
    assert "burn-in" not in causes(bars, splits)[0].evidence  # no burn-in ran: nothing said about it


def test_a_slow_link_with_little_exposed_communication_is_not_a_cause() -> None:
    splits = one_run(comm_s=0.004)
    bars = waterfall(splits)
    assert causes(bars, splits, {"64gpu": slow_links(HEALTHY | {"ib05": 900.0})}) == []  # type: ignore[dict-item]
