"""The Slurm tier's waits (tests/slurm/stop_helpers.wait_for): the time a run's job is pending does not count."""

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
