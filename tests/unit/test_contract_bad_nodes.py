"""The bad-node ledger (contract/bad_nodes.py): written by runs, read bounded and tolerant, never fatal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpctrain.contract import bad_nodes
from hpctrain.errors import RunDirError


def entry(node: str, *, cluster: str = "hal", now: float = 1000.0, expiry_s: float = 100.0) -> bad_nodes.BadNode:
    return bad_nodes.new_entry(
        node,
        cluster=cluster,
        reason="compute 412 ms per pass vs 150 on the other nodes (2.7x worse)",
        kind="burn-in",
        evidence={"compute_ms": 412.0},
        run="/runs/x",
        job_id="12",
        expiry_s=expiry_s,
        now=now,
    )


def test_entries_round_trip_and_only_live_ones_of_the_cluster_count(tmp_path: Path) -> None:
    path = tmp_path / "state" / "bad-nodes.jsonl"
    bad_nodes.append_entries([entry("n2"), entry("n3", cluster="other"), entry("n4", expiry_s=1)], path)
    bad_nodes.append_entries([entry("n2", now=1050.0)], path)
    ledger = bad_nodes.read_ledger(path)
    assert ledger.warnings == [] and len(ledger.entries) == 4
    assert [(e.node, e.time) for e in ledger.live("hal", now=1010.0)] == [("n2", 1050.0)]
    assert {e.node for e in ledger.live(now=1010.0)} == {"n2", "n3"}
    assert ledger.entries[0].evidence == {"compute_ms": 412.0} and os.stat(path).st_mode & 0o777 == 0o600


def test_forget_removes_a_node_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "bad-nodes.jsonl"
    bad_nodes.append_entries([entry("n2"), entry("n3"), entry("n2", cluster="other")], path)
    assert bad_nodes.forget("n2", path, cluster="hal") == 1
    assert [(e.node, e.cluster) for e in bad_nodes.read_ledger(path).entries] == [("n3", "hal"), ("n2", "other")]
    assert bad_nodes.forget("n9", path) == 0


@pytest.mark.parametrize(
    "make, said",
    [
        (lambda p: p.write_text('{"node": "n2", garbage\nnot json at all\n[1, 2]\n'), "3 line(s) that are not"),
        (lambda p: p.write_bytes(b"x" * (bad_nodes.MAX_LEDGER_BYTES + 1)), "larger than"),
        (lambda p: os.mkfifo(p), "a FIFO"),
        (lambda p: p.mkdir(), "a directory"),
    ],
    ids=["corrupt", "huge", "fifo", "directory"],
)
def test_a_bad_ledger_is_ignored_with_a_warning(tmp_path: Path, make, said: str) -> None:  # noqa: ANN001
    path = tmp_path / "bad-nodes.jsonl"
    make(path)
    ledger = bad_nodes.read_ledger(path)
    assert ledger.entries == [] and len(ledger.warnings) == 1 and said in ledger.warnings[0], ledger.warnings


def test_a_corrupt_line_skips_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "bad-nodes.jsonl"
    bad_nodes.append_entries([entry("n2")], path)
    with open(path, "ab") as handle:
        handle.write(b'{"node": ""}\n{"node": "n5", "time": NaN, "expires": 1e400}\n')
    ledger = bad_nodes.read_ledger(path)
    assert [e.node for e in ledger.entries] == ["n2"] and "2 line(s)" in ledger.warnings[0]  # NaN: not a time


def test_another_users_ledger_is_ignored_and_never_written(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the file to another user")
    path = tmp_path / "bad-nodes.jsonl"
    bad_nodes.append_entries([entry("n2")], path)
    os.chown(path, 65534, 65534)
    ledger = bad_nodes.read_ledger(path)
    assert ledger.entries == [] and "owned by another user" in ledger.warnings[0]
    with pytest.raises(OSError, match="another user"):
        bad_nodes.append_entries([entry("n3")], path)


def test_forget_on_an_unreadable_ledger_says_so(tmp_path: Path) -> None:
    path = tmp_path / "bad-nodes.jsonl"
    os.mkfifo(path)
    with pytest.raises(RunDirError, match="FIFO"):
        bad_nodes.forget("n2", path)


def test_a_long_ledger_drops_its_expired_entries_on_the_next_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bad-nodes.jsonl"
    monkeypatch.setattr(bad_nodes, "COMPACT_ABOVE_BYTES", 500)
    bad_nodes.append_entries([entry(f"old{i}", expiry_s=1) for i in range(5)] + [entry("kept", expiry_s=1e6)], path)
    bad_nodes.append_entries([entry("new", now=5000.0)], path, now=5000.0)
    assert [e.node for e in bad_nodes.read_ledger(path).entries] == ["kept", "new"]


def test_an_entry_too_big_for_a_line_loses_its_evidence_not_its_node() -> None:
    big = entry("n2")
    big.evidence = {"blob": "x" * bad_nodes.MAX_ENTRY_BYTES}
    line = bad_nodes.entry_line(big)
    assert len(line) < bad_nodes.MAX_ENTRY_BYTES and b'"evidence": {}' in line and b'"n2"' in line
