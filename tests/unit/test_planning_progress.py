"""``hpctrain status`` of a queued or running run: its expected start and finish, from the plan's timeline."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

import hpctrain
from hpctrain.contract.slurm_answers import JOB_TIMES_FORMAT, parse_job_times, slurm_duration_s
from hpctrain.planning.progress import estimate
from tests.fake_slurm import FakeSlurm

pytestmark = pytest.mark.usefixtures("isolated")

GOLDEN = Path(__file__).parent / "golden" / "slurm" / "24.11"
RUNNING = (GOLDEN / "squeue_times_running.txt").read_text()  # RUNNING, limit 10:00, all of it left
PENDING = (GOLDEN / "squeue_times_pending.txt").read_text()  # seconds after submit: no planned start yet
NOW = datetime(2026, 11, 29, 0, 13, 19).timestamp()
ASK = f"squeue -h -t all -o {JOB_TIMES_FORMAT} -j 77"


def run_dir(
    tmp_path: Path, *, done: int, total_epochs: int = 2, steps_per_epoch: int = 100, step_s: float = 1.0
) -> Path:
    folder = tmp_path / "runs" / "x" / "20261129-001300"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"job_id": "77", "job_ids": ["77"], "name": "x", "backend": "slurm"}))
    summary = {"status": "running", "epochs": total_epochs, "steps_per_epoch": steps_per_epoch, "global_step": done}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "spec.yaml").write_text("resources:\n  time: '00:10:00'\nsignals:\n  signal_delay_s: 120\n")
    lines = [
        {"kind": "train_step", "epoch": 0, "step": i, "global_step": i, "step_s": step_s, "time": i * step_s}
        for i in range(1, 6)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def at(seconds: float) -> str:
    return datetime.fromtimestamp(NOW + seconds).astimezone().strftime("%Y-%m-%dT%H:%M:%S%z")


def test_slurms_times_are_read_as_recorded() -> None:
    times = parse_job_times(RUNNING)
    assert times is not None and times.state == "RUNNING"
    assert (times.time_limit_s, times.time_left_s, times.time_used_s) == (600, 600, 0)
    assert times.end is not None and times.start is not None and (times.end - times.start).total_seconds() == 600
    assert [slurm_duration_s(t) for t in ("9:57", "1:02:03", "2-01:02:03", "UNLIMITED", "N/A")] == [
        597, 3723, 176523, None, None,
    ]  # fmt: skip
    assert parse_job_times("RUNNING\n") is None


def test_a_running_run_that_fits_finishes_after_its_steps_left(tmp_path: Path) -> None:
    fake = FakeSlurm(answers={ASK: (0, RUNNING)})
    found = estimate(run_dir(tmp_path, done=150), "77", fake.client(), clock=lambda: NOW)
    assert found is not None and found.steps_left == 50 and found.chunks_left == 0
    assert found.expected_finish == at(50) and found.expected_start is None


def test_a_running_run_with_chunks_to_queue_gets_a_lower_bound_and_says_why(tmp_path: Path) -> None:
    fake = FakeSlurm(answers={ASK: (0, RUNNING)})
    found = estimate(run_dir(tmp_path, done=0, step_s=10.0), "77", fake.client(), clock=lambda: NOW)
    # 2,000 s to train; 600 - 120 s fit now; then chunks of 600 - 120 - 120 s
    assert found is not None and found.expected_finish is None and found.chunks_left == 5
    assert found.finish_at_least is not None and "queue wait" in found.basis


def test_a_queued_run_shows_slurms_start_and_the_finish_after_it(tmp_path: Path) -> None:
    start = datetime.fromtimestamp(NOW + 600).strftime("%Y-%m-%dT%H:%M:%S")
    fake = FakeSlurm(answers={ASK: (0, f"PENDING|{start}|N/A|10:00|10:00|0:00\n")})
    found = estimate(run_dir(tmp_path, done=150), "77", fake.client(), clock=lambda: NOW)
    assert found is not None and found.expected_start == at(600)
    assert found.expected_finish == at(600 + 120 + 50) and "Slurm's own estimate" in found.basis


def test_a_queued_run_without_a_planned_start_says_so(tmp_path: Path) -> None:
    fake = FakeSlurm(answers={ASK: (0, PENDING)})
    found = estimate(run_dir(tmp_path, done=0), "77", fake.client(), clock=lambda: NOW)
    assert found is not None and found.expected_start is None and found.expected_finish is None
    assert "not planned the job's start" in found.basis


def test_an_ended_or_forgotten_job_has_no_estimate(tmp_path: Path) -> None:
    folder = run_dir(tmp_path, done=0)
    assert (
        estimate(folder, "77", FakeSlurm(answers={ASK: (0, RUNNING.replace("RUNNING", "COMPLETED"))}).client()) is None
    )
    assert estimate(folder, "77", FakeSlurm(answers={ASK: (1, "Invalid job id specified")}).client()) is None


def test_status_shows_the_estimate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeSlurm({"77": "RUNNING"}, answers={ASK: (0, RUNNING)}).install(monkeypatch)
    found = hpctrain.status(run_dir(tmp_path, done=150))
    assert isinstance(found, hpctrain.RunStatus)
    assert (
        found.steps_left == 50
        and found.expected_finish is not None
        and "fit in this job's time left" in (found.basis or "")
    )
