"""``hpctrain rehearse`` as a library (launch/rehearsal.py), with Slurm replaced by a fake that
requeues the job once it gets the time-limit signal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hpctrain.launch.rehearsal as rehearsal
from hpctrain.contract.rundir import cancel_marker_path, write_summary
from hpctrain.errors import ClusterError
from hpctrain.jobspec.load import load_job
from hpctrain.launch.submission import SubmittedRun

REPO = Path(__file__).resolve().parents[2]


class FakeSlurm:
    """One job: RUNNING; after the signal, PENDING (held) until released, then RUNNING as a restart."""

    def __init__(self, run_dir: Path, ends_as: str | None = None) -> None:
        self.run_dir, self.ends_as = run_dir, ends_as
        self.state, self.calls = "RUNNING", []

    def job_state(self, job_id: str) -> str:
        return self.ends_as or self.state

    def signal_job(self, job_id: str, name: str) -> None:
        self.calls.append(("signal", job_id, name))
        self.state = "PENDING"

    def release_job(self, job_id: str) -> None:
        self.calls.append(("release", job_id))
        self.state = "RUNNING"
        write_summary(self.run_dir, {"status": "running", "restarts": 1, "global_step": 12})

    def cancel_job(self, job_id: str) -> None:
        self.calls.append(("cancel", job_id))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    slurm = FakeSlurm(run_dir)
    monkeypatch.setattr(rehearsal, "submit", lambda job: SubmittedRun("77", run_dir, "slurm", [], [run_dir]))
    monkeypatch.setattr(rehearsal, "job_state", slurm.job_state)
    monkeypatch.setattr(rehearsal, "latest_checkpoint_step", lambda run_dir: 8)
    for name in ("signal_job", "release_job", "cancel_job"):
        monkeypatch.setattr(f"hpctrain.contract.slurm.{name}", getattr(slurm, name))
    monkeypatch.setattr(rehearsal.time, "sleep", lambda seconds: None)
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    return slurm


def test_a_rehearsal_signals_releases_sees_the_restart_and_cancels(fake: FakeSlurm) -> None:
    said: list[str] = []
    done = rehearsal.rehearse(load_job(REPO / "jobs/smoke_2x2_cpu.yaml"), 60, said.append)
    assert (done.job_id, done.run_dir, done.resumed_from_step) == ("77", fake.run_dir, 8)
    assert [call[0] for call in fake.calls] == ["signal", "release", "cancel"]
    assert said[1].startswith("1/3 checkpoint at step 8") and said[2].startswith("2/3 stopped at step 8")
    assert json.loads(cancel_marker_path(fake.run_dir).read_text())["job_ids"] == ["77"]  # cancel, not a requeue


def test_a_rehearsal_whose_job_ends_first_is_a_cluster_error(fake: FakeSlurm, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rehearsal, "latest_checkpoint_step", lambda run_dir: None)
    fake.ends_as = "FAILED"
    with pytest.raises(ClusterError, match="rehearsal job 77 ended FAILED before a first checkpoint"):
        rehearsal.rehearse(load_job(REPO / "jobs/smoke_2x2_cpu.yaml"), 60, print)
    assert fake.calls == []


def test_what_a_script_saved_is_any_file_hpctrain_did_not_write(tmp_path: Path) -> None:
    script_saved = rehearsal.script_saved
    for own in ("spec.yaml", "run.json", "summary.json", "metrics.jsonl"):
        (tmp_path / own).write_text("{}")
    for folder in ("submitit", "code", ".hpctrain", "heartbeats", "checkpoints"):
        (tmp_path / folder).mkdir()
    (tmp_path / ".snapshot.pt.tmp").write_text("half")
    assert script_saved(tmp_path) is None, "hpctrain's own files, and a temp file still being written"
    (tmp_path / "checkpoints" / "epoch-1.pt").write_text("x")
    assert script_saved(tmp_path) == "checkpoints/epoch-1.pt"
    (tmp_path / "snapshot.pt").write_text("x")
    assert script_saved(tmp_path) == "snapshot.pt"
