"""The one what-if model (contract/scaling_model.py) on plain numbers: the step at scales never measured."""

from __future__ import annotations

import pytest

from hpctrain.contract.scaling_model import Scale, StepModel, one_per_scale, run_devices, scale_of
from hpctrain.contract.step_split import PARTS


def parts(**seconds: float) -> dict[str, float]:
    return {p: seconds.get(p, 0.0) for p in PARTS}


WEAK = [  # 32 images per rank at both scales
    Scale(4, 1 / 32, parts(forward=0.020, backward=0.040, data=0.005, comm=0.012, straggler=0.003), windows=6),
    Scale(8, 1 / 32, parts(forward=0.020, backward=0.040, data=0.005, comm=0.018, straggler=0.004), windows=6),
]


def test_above_the_largest_scale_comm_grows_on_a_line_in_log2_devices() -> None:
    model = StepModel(WEAK)
    at16, at32 = model.at(16), model.at(32)
    assert at16.parts["comm"] == pytest.approx(0.024) and at32.parts["comm"] == pytest.approx(0.030)
    assert at16.parts["forward"] == pytest.approx(0.020) and at16.parts["straggler"] == pytest.approx(0.004)
    assert at16.step_s == pytest.approx(0.093) and at32.step_s == pytest.approx(0.099)
    assert at16.efficiency == pytest.approx(0.080 / 0.093)  # the 4-device step over this one
    assert at32.dominant == "comm" and at32.dominant_label == "exposed communication"
    assert at32.dominant_loss == pytest.approx((0.030 - 0.012) / 0.099)
    assert not at16.measured
    assert "exposed communication 24.0 ms per step" in at16.model
    assert "12.0 ms at 4 devices and 18.0 ms at 8 devices" in at16.model


def test_a_fixed_global_batch_halves_the_ranks_own_work_but_not_its_communication() -> None:
    """Global batch 512: 128 images per rank at 4 devices, 64 at 8, 32 at 16 (strong scaling)."""
    strong = [
        Scale(4, 4 / 512, parts(forward=0.080, backward=0.160, data=0.020, comm=0.012), windows=4),
        Scale(8, 8 / 512, parts(forward=0.040, backward=0.080, data=0.010, comm=0.018, straggler=0.002), windows=4),
    ]
    at16 = StepModel(strong).at(16, per_image=16 / 512)
    assert at16.parts["backward"] == pytest.approx(0.040) and at16.parts["data"] == pytest.approx(0.005)
    assert at16.parts["straggler"] == pytest.approx(0.001) and at16.parts["comm"] == pytest.approx(0.024)
    assert at16.step_s == pytest.approx(0.090)
    assert at16.efficiency == pytest.approx(0.068 / 0.090)  # 0.272 s at 128 images per rank: 0.068 s at 32
    assert at16.dominant == "comm" and at16.dominant_loss == pytest.approx((0.024 - 0.003) / 0.090)
    # without a per-rank batch the largest scale's stands: weak scaling from there
    assert StepModel(strong).at(16).parts["backward"] == pytest.approx(0.080)


def test_a_measured_scale_gives_back_its_own_parts_and_its_step_bar() -> None:
    at4 = StepModel(WEAK).at(4)
    assert at4.measured and at4.step_s == pytest.approx(0.080) and at4.efficiency == pytest.approx(1.0)
    assert at4.dominant == "comm" and at4.dominant_loss == pytest.approx(0.012 / 0.080)  # largest non-compute part


def test_below_the_smallest_scale_comm_shrinks_and_one_device_has_none() -> None:
    slow_data = [Scale(s.devices, s.per_image, {**s.parts, "data": 0.010}, s.windows) for s in WEAK]
    model = StepModel(slow_data)
    at2 = model.at(2)
    assert at2.parts["comm"] == pytest.approx(0.006) and at2.parts["straggler"] == pytest.approx(0.003)
    assert at2.dominant == "data" and at2.dominant_label == "data wait"
    at1 = model.at(1)
    assert at1.parts["comm"] == 0 and at1.parts["straggler"] == 0 and at1.step_s == pytest.approx(0.070)
    assert "none on one device" in at1.model
    steep = [Scale(4, 1.0, parts(forward=0.05, comm=0.002)), Scale(8, 1.0, parts(forward=0.05, comm=0.030))]
    assert StepModel(steep).at(2).parts["comm"] == 0.0  # the line would go below zero


def test_comm_that_shrank_is_held_at_the_largest_scales_above_it() -> None:
    shrinking = [Scale(4, 1.0, parts(forward=0.05, comm=0.020)), Scale(8, 1.0, parts(forward=0.05, comm=0.010))]
    assert StepModel(shrinking).at(64).parts["comm"] == pytest.approx(0.010)


def test_between_measured_scales_comm_is_interpolated_and_the_larger_neighbour_anchors_a_tie() -> None:
    apart = [
        Scale(4, 1.0, parts(forward=0.050, comm=0.010)),
        Scale(16, 1.0, parts(forward=0.060, comm=0.030)),
    ]
    at8 = StepModel(apart).at(8)
    assert at8.parts["comm"] == pytest.approx(0.020) and at8.parts["forward"] == pytest.approx(0.060)
    assert "measured at 16 devices (the nearest measured)" in at8.model


def test_one_measured_scale_holds_comm_and_says_so() -> None:
    at8 = StepModel(WEAK[:1], kind="GPUs").at(8)
    assert at8.parts["comm"] == pytest.approx(0.012) and at8.step_s == pytest.approx(0.080)
    assert "held at the one measured scale's, 4 GPUs: optimistic" in at8.model


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        StepModel([])
    with pytest.raises(ValueError):
        StepModel(WEAK).at(0)


def test_the_scale_with_the_most_windows_stands_for_its_device_count() -> None:
    few, many = Scale(8, 1.0, parts(forward=0.1), windows=2), Scale(8, 1.0, parts(forward=0.2), windows=9)
    assert one_per_scale([many, Scale(2, 1.0, parts(forward=0.1)), few]) == [
        Scale(2, 1.0, parts(forward=0.1)),
        many,
    ]


def window(step: int, epoch: int, **seconds: float) -> dict[str, object]:
    record: dict[str, object] = {"kind": "step_split", "global_step": step, "epoch": epoch, "ranks": 6}
    record.update({f"{p}_s": seconds.get(p, 0.0) for p in PARTS})
    record["step_s"] = sum(seconds.values())
    return record


def test_a_scale_is_the_mean_of_the_steady_windows() -> None:
    records = [
        window(5, 0, forward=0.9, comm=0.5),  # each epoch's first window: warm-up, left out
        window(10, 0, forward=0.10, comm=0.02),
        window(15, 0, forward=0.12, comm=0.04),
        window(20, 1, forward=0.8),
        window(25, 1, forward=0.14, comm=0.03),
    ]
    scale = scale_of(records, devices=None, global_batch=48)
    assert scale is not None and (scale.devices, scale.windows) == (6, 3)
    assert scale.per_image == pytest.approx(6 / 48)
    assert scale.parts["forward"] == pytest.approx(0.12) and scale.parts["comm"] == pytest.approx(0.03)
    assert scale_of([], devices=4, global_batch=8) is None
    assert scale_of([window(5, 0)], devices=4, global_batch=8) is None  # no positive step time


def test_devices_are_gpus_when_used_else_processes() -> None:
    assert run_devices(3, 4, 12, on_cpu=False) == (12, "GPU")
    assert run_devices(3, 4, 6, on_cpu=True) == (6, "process")
    assert run_devices(2, None, 8, on_cpu=False) == (8, "process")
