"""planning/step_time.py's choice of model: the report's what-if model where step_split records exist, else the fit."""

from __future__ import annotations

import pytest

from hpctrain.contract.scaling_model import Scale
from hpctrain.contract.step_split import PARTS
from hpctrain.planning.step_time import Measurement, step_times


def scale(devices: int, **seconds: float) -> Scale:
    return Scale(devices, 1 / 64, {p: seconds.get(p, 0.0) for p in PARTS}, windows=5)


# 4 GPUs per node; 64 images per GPU at every shape (trainer.batch_size is per device)
AT_1 = scale(4, forward=0.10, backward=0.20, optimizer=0.02, data=0.01, comm=0.030, straggler=0.004)
AT_2 = scale(8, forward=0.10, backward=0.20, optimizer=0.02, data=0.01, comm=0.050, straggler=0.006)


def test_unmeasured_shapes_come_from_the_split_model_with_what_dominates() -> None:
    runs = [Measurement(1, 0.364, 40, "runs/a", AT_1), Measurement(2, 0.386, 40, "runs/b", AT_2)]
    times = step_times((1, 2, 4, 8), runs)
    one, two, four, eight = (times[n] for n in (1, 2, 4, 8))
    assert one is not None and one.model == "measured" and one.seconds == 0.364 and not one.extrapolated
    assert one.dominant == "exposed communication"  # its step bar: the largest part that is not compute
    assert four is not None and four.model == "step split" and four.extrapolated
    # 16 GPUs: compute 320 ms, data 10, straggler 6 as at 8; comm 50 ms + 20 ms per doubling = 70 ms
    assert four.seconds == pytest.approx(0.32 + 0.01 + 0.006 + 0.070)
    assert eight is not None and eight.seconds == pytest.approx(0.32 + 0.01 + 0.006 + 0.090)
    assert eight.dominant == "exposed communication"
    assert eight.dominant_loss == pytest.approx((0.090 - 0.030) / 0.426)
    assert eight.dominates() == "exposed communication 14 %"
    assert "exposed communication 90.0 ms per step" in eight.source and "at 8 devices" in eight.source
    assert two is not None and two.dominates().startswith("exposed communication")


def test_without_step_split_records_the_fit_answers_and_nothing_is_said_to_dominate() -> None:
    runs = [Measurement(1, 0.30, 40, "runs/a"), Measurement(2, 0.34, 40, "runs/b")]
    four = step_times((4,), runs)[4]
    assert four is not None and four.model == "fit" and four.seconds == pytest.approx(0.38)
    assert four.dominant is None and four.dominates() == ""


def test_a_run_without_records_still_counts_as_measured_beside_the_split_model() -> None:
    runs = [Measurement(1, 0.36, 40, "runs/a", AT_1), Measurement(2, 0.40, 40, "runs/b")]
    times = step_times((2, 4), runs)
    assert times[2] is not None and times[2].model == "measured" and times[2].seconds == 0.40
    four = times[4]  # one scale with records: communication held at its 30 ms, and said to be optimistic
    assert four is not None and four.model == "step split" and four.seconds == pytest.approx(0.364)
    assert "optimistic" in four.source


def test_the_users_step_time_at_its_node_count_still_wins_there() -> None:
    runs = [Measurement(1, 0.364, 40, "runs/a", AT_1), Measurement(2, 0.386, 40, "runs/b", AT_2)]
    four = step_times((4,), runs, user_step_s=0.5, user_nodes=4)[4]
    assert four is not None and four.model == "yours" and four.seconds == 0.5


def test_records_whose_parts_say_nothing_leave_the_fit_to_answer() -> None:
    empty = Scale(4, 1 / 64, {p: 0.0 for p in PARTS})  # step_s logged, every part missing or unreadable
    runs = [Measurement(1, 0.30, 40, "runs/a", empty), Measurement(2, 0.34, 40, "runs/b")]
    four = step_times((4,), runs)[4]
    assert four is not None and four.model == "fit" and four.seconds == pytest.approx(0.38)
