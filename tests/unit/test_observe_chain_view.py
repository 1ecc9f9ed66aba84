"""observe/chain_view.py: status shows a run's whole chain, first run first, with the chain's reasons."""

from __future__ import annotations

import json
from pathlib import Path

from hpctrain.contract.chain_links import record_dependent, write_chain_end
from hpctrain.contract.summary import write_summary
from hpctrain.observe.chain_view import chain_lines, chain_rows, first_run


class StubSlurm:
    def __init__(self, states: dict[str, str]) -> None:
        self.states = states

    def available(self) -> bool:
        return True

    def job_state(self, job_id: str) -> str:
        return self.states[job_id]


def make_run(folder: Path, job_id: str, status: str | None, upstream: Path | None = None) -> Path:
    folder.mkdir(parents=True)
    info: dict[str, object] = {"job_id": job_id, "backend": "slurm"}
    if upstream is not None:
        info["after"] = {"run_dir": str(upstream), "when": "completed"}
        record_dependent(upstream, folder, "completed")
    (folder / "run.json").write_text(json.dumps(info))
    if status is not None:
        write_summary(folder, {"status": status})
    return folder


def test_a_run_in_no_chain_shows_none(tmp_path: Path) -> None:
    run = make_run(tmp_path / "alone", "1", "running")
    assert chain_rows(run, slurm=StubSlurm({"1": "RUNNING"})) == []  # type: ignore[arg-type]


def test_the_chain_is_shown_from_its_first_run_with_reasons(tmp_path: Path) -> None:
    first = make_run(tmp_path / "first", "1", "failed")
    second = make_run(tmp_path / "second", "2", "stopped", upstream=first)
    third = make_run(tmp_path / "third", "3", None, upstream=second)
    write_chain_end(second, f"after: {first} failed (this run waits for when: completed); it never ran", first, "end")
    assert first_run(third) == first
    rows = chain_rows(third, slurm=StubSlurm({"1": "FAILED", "2": "COMPLETED", "3": "PENDING"}))  # type: ignore[arg-type]
    assert [(row["run_dir"], row["depth"]) for row in rows] == [(str(first), 0), (str(second), 1), (str(third), 2)]
    assert rows[0]["status"] == "failed"
    assert rows[1]["status"] == "ended by its chain" and "never ran" in rows[1]["reason"]
    assert rows[2]["status"] == "pending (after: completed)"
    lines = chain_lines(rows, str(third))
    assert lines[0].startswith(f"  {first}") and any(line.startswith("*") and str(third) in line for line in lines)


def test_a_cycle_in_hand_edited_records_ends(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "1", "running")
    b = make_run(tmp_path / "b", "2", "running", upstream=a)
    info = json.loads((a / "run.json").read_text())
    (a / "run.json").write_text(json.dumps({**info, "after": {"run_dir": str(b)}}))
    record_dependent(b, a, "completed")
    rows = chain_rows(a, slurm=StubSlurm({"1": "RUNNING", "2": "RUNNING"}))  # type: ignore[arg-type]
    assert sorted(row["run_dir"] for row in rows) == [str(a), str(b)]
