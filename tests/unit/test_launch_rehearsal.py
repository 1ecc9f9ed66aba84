"""``hpctrain rehearse`` as a library (launch/rehearsal.py), with Slurm replaced by a fake that
requeues the job once it gets the time-limit signal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hpctrain.launch.rehearsal as rehearsal
from hpctrain.contract.rundir import (
    CODE_DIR,
    CONTROL_DIR,
    cancel_marker_path,
    checkpoints_dir,
    metrics_path,
    run_info_path,
    spec_path,
    submitit_dir,
    summary_path,
)
from hpctrain.contract.summary import write_summary
from hpctrain.errors import ClusterError
from hpctrain.jobspec.load import load_job
from hpctrain.launch.submission import SubmittedRun
from tests.fake_slurm import FakeSlurm

REPO = Path(__file__).resolve().parents[2]


class RequeuingSlurm(FakeSlurm):
    """One job: RUNNING; after the time-limit signal, PENDING (held) until released, then RUNNING as a restart."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__({"77": "RUNNING"})
        self.run_dir = run_dir

    def _scancel(self, argv: list[str]) -> tuple[int, str]:
        if argv[1:2] == ["--signal=USR2"]:
            self.jobs["77"] = "PENDING"
            return 0, ""
        return super()._scancel(argv)

    def _scontrol(self, argv: list[str]) -> tuple[int, str]:
        if argv[1:2] == ["update"]:
            self.jobs["77"] = "RUNNING"
            write_summary(self.run_dir, {"status": "running", "restarts": 1, "global_step": 12})
        return super()._scontrol(argv)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RequeuingSlurm:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    slurm = RequeuingSlurm(run_dir)
    monkeypatch.setattr(rehearsal, "submit_run", lambda job: SubmittedRun("77", run_dir, "slurm", [], [run_dir]))
    monkeypatch.setattr(rehearsal, "latest_checkpoint_step", lambda run_dir: 8)
    monkeypatch.setenv("HPCTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    return slurm


def rehearse(fake: RequeuingSlurm, say) -> rehearsal.Rehearsed:  # type: ignore[no-untyped-def]
    return rehearsal.rehearse(load_job(REPO / "jobs/smoke_2x2_cpu.yaml"), 60, say, slurm=fake.client())


def test_a_rehearsal_signals_releases_sees_the_restart_and_cancels(fake: RequeuingSlurm) -> None:
    said: list[str] = []
    done = rehearse(fake, said.append)
    assert (done.job_id, done.run_dir, done.resumed_from_step) == ("77", fake.run_dir, 8)
    assert [argv for argv in fake.commands if argv[0] != "sacct"] == [
        ["scancel", "--signal=USR2", "77"],
        ["scontrol", "update", "JobId=77", "StartTime=now"],
        ["scancel", "77"],
    ]
    assert said[1].startswith("1/3 checkpoint at step 8") and said[2].startswith("2/3 stopped at step 8")
    assert json.loads(cancel_marker_path(fake.run_dir).read_text())["job_ids"] == ["77"]  # cancel, not a requeue


def test_a_rehearsal_whose_job_ends_first_is_a_cluster_error(
    fake: RequeuingSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rehearsal, "latest_checkpoint_step", lambda run_dir: None)
    fake.jobs["77"] = "FAILED"
    with pytest.raises(ClusterError, match="rehearsal job 77 ended FAILED before a first checkpoint"):
        rehearse(fake, print)
    assert {argv[0] for argv in fake.commands} == {"sacct"}


def test_what_a_script_saved_is_any_file_hpctrain_did_not_write(tmp_path: Path) -> None:
    script_saved = rehearsal.script_saved
    for own in (spec_path(tmp_path), run_info_path(tmp_path), summary_path(tmp_path), metrics_path(tmp_path)):
        own.write_text("{}")
    for folder in (submitit_dir(tmp_path), tmp_path / CODE_DIR, tmp_path / CONTROL_DIR, checkpoints_dir(tmp_path)):
        folder.mkdir()
    (tmp_path / ".snapshot.pt.tmp").write_text("half")
    assert script_saved(tmp_path) is None, "hpctrain's own files, and a temp file still being written"
    (checkpoints_dir(tmp_path) / "epoch-1.pt").write_text("x")
    assert script_saved(tmp_path) == "checkpoints/epoch-1.pt"
    (tmp_path / "snapshot.pt").write_text("x")
    assert script_saved(tmp_path) == "snapshot.pt"
