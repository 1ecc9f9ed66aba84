"""The Slurm tier's waits (tests/slurm/stop_helpers.wait_for): the time a run's job is pending, or its tasks are
writing, does not count; a run that writes nothing runs the wait out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm import stop_helpers
from tests.slurm.stop_helpers import Run, wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(stop_helpers, "time", fake)
    monkeypatch.setattr(stop_helpers, "task_logs", lambda run_dir: "(the run's logs)")
    monkeypatch.setattr(stop_helpers, "run_output_size", lambda run_dir: 0)  # a silent run unless a test says
    return fake


def test_a_wait_on_a_run_does_not_count_the_time_its_job_is_pending(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pending for its first 100 s (behind another test file's job), then the step comes 20 s after it starts:
    a 30 s wait on the run still sees it."""
    monkeypatch.setattr(stop_helpers, "job_pending", lambda job_id: clock.now < 100)
    value = wait_for(lambda: clock.now >= 120 and "step 1", "the first step", 30, Run("7", Path("/run")), poll_s=1)
    assert value == "step 1"


def test_without_a_run_or_past_the_allowance_the_wait_runs_out_and_says_how_long_it_waited(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stop_helpers, "job_pending", lambda job_id: True)
    with pytest.raises(AssertionError, match=r"timed out after 30 s waiting for the first step"):
        wait_for(lambda: clock.now >= 120, "the first step", 30, poll_s=1)
    clock.now = 0.0
    with pytest.raises(AssertionError, match=r"(?s)after 30 s \(and 300 s while its job was pending\).*run.s logs"):
        wait_for(lambda: False, "the first step", 30, Run("7", Path("/run")), poll_s=1)
    assert clock.now == pytest.approx(330, abs=stop_helpers.QUEUE_CHECK_S + 1)


def test_a_wait_on_a_run_whose_tasks_keep_writing_does_not_count_that_time_up_to_its_allowance(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running (not pending) and logging a line every 2 s, on a machine slow enough that the step comes after
    150 s: a 90 s wait sees it. A run that wrote nothing is failed at 90 s; one that writes forever at 90 s plus
    the allowance."""
    monkeypatch.setattr(stop_helpers, "job_pending", lambda job_id: False)
    monkeypatch.setattr(stop_helpers, "run_output_size", lambda run_dir: int(clock.now // 2))
    run = Run("7", Path("/run"))
    assert wait_for(lambda: clock.now >= 150 and "step 2", "the second step", 90, run, poll_s=1) == "step 2"
    clock.now = 0.0
    with pytest.raises(AssertionError, match=r"after 90 s \(and 300 s while its tasks were writing\)"):
        wait_for(lambda: False, "the second step", 90, run, poll_s=1)
    assert clock.now == pytest.approx(390, abs=stop_helpers.QUEUE_CHECK_S + 1)
    monkeypatch.setattr(stop_helpers, "run_output_size", lambda run_dir: 0)
    clock.now = 0.0
    with pytest.raises(AssertionError, match=r"timed out after 90 s waiting for the second step\n"):
        wait_for(lambda: False, "the second step", 90, run, poll_s=1)
    assert clock.now == pytest.approx(90, abs=2)


def test_the_run_output_size_counts_the_task_logs_and_the_metrics(tmp_path: Path) -> None:
    from hpctrain.contract.rundir import metrics_path, submitit_dir

    assert stop_helpers.run_output_size(tmp_path) == 0  # nothing yet: no folder, no error
    submitit_dir(tmp_path).mkdir(parents=True)
    (submitit_dir(tmp_path) / "7_0_log.out").write_text("step 1\n")
    (submitit_dir(tmp_path) / "7_0_log.err").write_text("warning\n")
    (submitit_dir(tmp_path) / "7_submitted.pkl").write_bytes(b"x" * 100)  # not the tasks' writing
    metrics_path(tmp_path).parent.mkdir(parents=True, exist_ok=True)
    metrics_path(tmp_path).write_text("{}\n")
    assert stop_helpers.run_output_size(tmp_path) == 7 + 8 + 3
