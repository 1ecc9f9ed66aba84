"""``hpctrain resume`` of a run whose Slurm job has ended while its tasks stop (COMPLETING): it waits, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UsageError
from hpctrain.launch.resume import refuse_while_writing


class StoppingJob:
    """Slurm for one job that ended FAILED and whose processes Slurm sees for ``stopping_polls`` more asks."""

    def __init__(self, stopping_polls: int | None, state: str = "FAILED") -> None:
        self.left, self.state, self.asked = stopping_polls, state, 0

    def available(self) -> bool:
        return True

    def job_state(self, job_id: str) -> str:
        assert job_id == "22"
        return self.state

    def processes_may_run(self, job_id: str) -> bool:
        self.asked += 1
        if self.left is None:
            return True  # they never stop
        self.left -= 1
        return self.left >= 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


INFO = {"job_id": "22", "backend": "slurm"}


def test_a_resume_right_after_a_failure_waits_for_the_tasks_to_stop_then_goes_ahead(tmp_path: Path) -> None:
    """Found in a CI rehearsal: the job FAILED, its processes were gone, and squeue still said COMPLETING;
    resume refused ("try again in a few seconds") where it should have waited those seconds itself."""
    slurm, clock = StoppingJob(stopping_polls=3), FakeClock()
    refuse_while_writing(tmp_path, INFO, slurm=slurm, clock=clock, sleep=clock.sleep)  # returns: no refusal
    assert slurm.asked == 4 and clock.now == 3.0


def test_tasks_that_do_not_stop_are_refused_after_the_wait_with_the_way_out(tmp_path: Path) -> None:
    slurm, clock = StoppingJob(stopping_polls=None), FakeClock()
    with pytest.raises(UsageError, match="still stopping") as refused:
        refuse_while_writing(tmp_path, INFO, slurm=slurm, wait_s=10, clock=clock, sleep=clock.sleep)
    assert "did not stop within 10 s" in refused.value.hint and "hpctrain cancel" in refused.value.hint
    assert 10.0 <= clock.now <= 11.0


def test_a_running_job_is_refused_at_once(tmp_path: Path) -> None:
    slurm, clock = StoppingJob(stopping_polls=None, state="RUNNING"), FakeClock()
    with pytest.raises(UsageError, match="still RUNNING"):
        refuse_while_writing(tmp_path, INFO, slurm=slurm, clock=clock, sleep=clock.sleep)
    assert clock.now == 0.0 and slurm.asked == 0
