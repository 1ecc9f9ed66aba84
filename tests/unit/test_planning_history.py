"""planning/history.py's pace: the wall time per step a plan counts, validation and checkpoints included."""

from __future__ import annotations

from typing import Any

import pytest

from hpctrain.contract.starts import Start
from hpctrain.planning.history import Pace, pace_of


def steps(first: int, last: int, start_at: float, step_s: float = 0.1) -> list[dict[str, Any]]:
    return [
        {"kind": "train_step", "global_step": g, "step_s": step_s, "time": start_at + (g - first + 1) * step_s}
        for g in range(first, last + 1)
    ]


def test_what_runs_between_steps_counts_toward_the_pace() -> None:
    # two epochs of 10 steps at 0.1 s, and a 3 s validation + checkpoint between them
    records = steps(1, 10, 0.0) + steps(11, 20, 1.0 + 3.0)
    pace = pace_of(records)
    assert pace is not None and pace.basis == "wall" and pace.steps == 19
    assert pace.seconds == pytest.approx((4.0 + 1.0 - 0.1) / 19)  # 0.26 s a step, not the median's 0.1


def test_a_restart_and_the_steps_it_redid_are_left_out() -> None:
    # steps 1-10, killed after its checkpoint at 6, a new start 60 s later redoes 7-10 and goes on to 14
    first, later = steps(1, 10, 0.0), steps(7, 14, 61.0)
    starts = [Start(began=0.0, first=True), Start(began=60.0)]
    pace = pace_of(first + later, starts)
    assert pace == Pace(pytest.approx(0.1), 9 + 7, "wall", 0.1)


def test_without_a_starts_record_only_a_long_pause_is_taken_for_a_restart() -> None:
    records = steps(1, 10, 0.0) + steps(11, 20, 1.0 + 120.0) + steps(21, 30, 122.0 + 3600.0)
    pace = pace_of(records)  # the 120 s pause is the run's own (a long validation); the hour is a restart
    assert pace is not None and pace.steps == 28
    assert pace.seconds == pytest.approx((0.9 + 120.1 + 0.9 + 0.9) / 28)


def test_too_few_steps_in_a_row_fall_back_to_the_median() -> None:
    # step 5, then a start that redid 3 and 4: one step in a row is too few to time
    records = [steps(5, 5, 0.0, step_s=0.3)[0], *steps(3, 4, 50.0, step_s=0.2)]
    assert pace_of(records) == Pace(0.2, 3, "median", 0.2)
    assert pace_of([]) is None


def test_steps_logged_every_few_steps_are_timed_over_the_steps_between_them() -> None:
    records = [{"kind": "train_step", "global_step": g, "step_s": 0.1, "time": 0.15 * g} for g in (10, 20, 30)]
    assert pace_of(records) == Pace(pytest.approx(0.15), 20, "wall", 0.1)
