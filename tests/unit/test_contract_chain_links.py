"""contract/chain_links.py: the one decider, the links in the run directories, the upstream's values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpctrain.contract import chain_links
from hpctrain.contract.chain_links import (
    Link,
    chain_decision,
    dependents_of,
    outcome,
    record_dependent,
    upstream_values,
)
from hpctrain.contract.summary import write_summary


def make_run(folder: Path, *, job_id: str = "100", status: str | None = None, step: int | None = None) -> Path:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"job_id": job_id, "backend": "slurm"}))
    if status is not None:
        write_summary(folder, {"status": status, **({"global_step": step} if step is not None else {})})
    return folder


def make_checkpoint(run_dir: Path, step: int) -> Path:
    folder = run_dir / "checkpoints" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(b"x" * 5)
    meta = {"format_version": 1, "global_step": step, "files": {"state.pt": {"size": 5}}}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize(
    ("when", "upstream", "decision"),
    [
        ("completed", "completed", "start"),
        ("completed", "failed", "end"),
        ("completed", "cancelled", "end"),
        ("completed", "stopped", "wait"),
        ("completed", "running", "wait"),
        ("ended", "completed", "start"),
        ("ended", "failed", "start"),
        ("ended", "stopped", "wait"),
        ("failed", "completed", "end"),
        ("failed", "failed", "start"),
        ("failed", "cancelled", "start"),
        ("failed", "stopped", "wait"),
    ],
)
def test_the_decider_starts_ends_or_waits(when: str, upstream: str, decision: str) -> None:
    assert chain_decision(when, upstream) == decision  # type: ignore[arg-type]


def test_the_outcome_reads_the_upstreams_own_record(tmp_path: Path) -> None:
    assert outcome(make_run(tmp_path / "a", status="completed"), job_ended=True) == "completed"
    assert outcome(make_run(tmp_path / "b", status="stopped"), job_ended=True) == "stopped"
    lost = make_run(tmp_path / "c", status="running")
    assert outcome(lost, job_ended=False) == "running"
    assert outcome(lost, job_ended=True) == "failed"  # the job ended under a "running" summary: rank 0 was lost
    cancelled = make_run(tmp_path / "d", status="stopped")
    (cancelled / ".hpctrain").mkdir()
    (cancelled / ".hpctrain" / "cancel-requested").write_text("{}")
    assert outcome(cancelled, job_ended=True) == "cancelled"


def test_the_upstream_values_name_its_final_checkpoint_and_summary(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up", status="completed", step=40)
    make_checkpoint(upstream, 20)
    final = make_checkpoint(upstream, 40)
    (upstream / "checkpoints" / "step-00000060").mkdir()  # incomplete: no meta.json, never the final one
    values = upstream_values(upstream)
    assert values["checkpoint"] == str(final)
    assert values["run_dir"] == str(upstream) and values["job_id"] == "100"
    assert values["status"] == "completed" and values["global_step"] == "40"
    assert "val_top1" not in values  # absent in the summary: no value (filling it names it)


def test_no_checkpoint_means_no_value(tmp_path: Path) -> None:
    assert "checkpoint" not in upstream_values(make_run(tmp_path / "up", status="completed"))


def test_dependents_are_listed_oldest_first_and_odd_files_skipped(tmp_path: Path) -> None:
    upstream = make_run(tmp_path / "up")
    record_dependent(upstream, tmp_path / "second", "completed")
    record_dependent(upstream, tmp_path / "third", "failed")
    folder = upstream / ".hpctrain" / "dependents"
    (folder / "junk.json").write_text("[1, 2]")
    (folder / "huge.json").write_bytes(b"{" * (8 << 20))
    os.symlink("/etc/passwd", folder / "link.json")
    found = dependents_of(upstream)
    assert [(link.run_dir.name, link.when) for link in found] == [("second", "completed"), ("third", "failed")]


def test_dependents_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream = make_run(tmp_path / "up")
    monkeypatch.setattr(chain_links, "MAX_DEPENDENTS", 3)
    for index in range(5):
        record_dependent(upstream, tmp_path / f"d{index}", "completed")
    assert len(dependents_of(upstream)) == 3


def test_a_run_json_names_its_upstream(tmp_path: Path) -> None:
    run = make_run(tmp_path / "dep")
    assert chain_links.upstream_link(run) is None
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "after": {"run_dir": "/x/up", "when": "bogus"}}))
    assert chain_links.upstream_link(run) == Link(run, Path("/x/up"), "completed")


def test_the_chain_end_is_recorded_and_cleared(tmp_path: Path) -> None:
    run = make_run(tmp_path / "dep")
    chain_links.write_chain_end(run, "after: /x failed", tmp_path / "x", "end")
    assert chain_links.read_chain_end(run)["reason"] == "after: /x failed"  # type: ignore[index]
    chain_links.clear_chain_end(run)
    assert chain_links.read_chain_end(run) is None


def test_end_reasons_say_what_happened_and_what_to_do(tmp_path: Path) -> None:
    link = Link(tmp_path / "dep", tmp_path / "up", "completed")
    assert "failed" in chain_links.end_reason(link, "failed") and "never ran" in chain_links.end_reason(link, "failed")
    assert f"hpctrain resume {tmp_path / 'up'}" in chain_links.end_reason(link, "stopped")


def test_an_upstream_its_chain_ended_counts_as_cancelled_or_still_waiting(tmp_path: Path) -> None:
    ended = make_run(tmp_path / "ended", status="stopped")
    chain_links.write_chain_end(ended, "after: x failed", tmp_path / "x", "end")
    assert outcome(ended, job_ended=True) == "cancelled"
    waiting = make_run(tmp_path / "waiting", status="stopped")
    chain_links.write_chain_end(waiting, "after: x stopped", tmp_path / "x", "wait")
    assert outcome(waiting, job_ended=True) == "stopped"
