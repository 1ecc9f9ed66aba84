"""The waterfall, the causes and the what-if on synthetic splits (cases of their own: 8/16/32 GPUs, not the
local tests' two CPU ranks)."""

from __future__ import annotations

from typing import Any

import pytest

from hpctrain.contract.scaling_model import steady_records
from hpctrain.contract.step_split import LOCAL, PARTS
from hpctrain.observe.report.causes import MIN_LOSS, causes, predict
from hpctrain.observe.report.waterfall import chance_of_persistence, run_split, waterfall

COMPUTE = {"h2d": 0.004, "forward": 0.030, "backward": 0.060, "optimizer": 0.006}


def window(step: int, epoch: int = 0, *, slowest: int = 0, excess: dict[str, float] | None = None, **parts: float):
    record: dict[str, Any] = {"kind": "step_split", "global_step": step, "epoch": epoch, "attempt": 0, "ranks": 8}
    values = {p: 0.0 for p in PARTS} | COMPUTE | parts
    record |= {f"{p}_s": v for p, v in values.items()}
    record["step_s"] = sum(values.values())
    record["slowest_rank"] = slowest
    record |= {f"slowest_{p}_s": (excess or {}).get(p, 0.0) for p in LOCAL}
    return record


def split_of(devices: int, windows: list[dict[str, Any]], **kwargs: Any):
    for record in windows:
        record["ranks"] = devices
    return run_split(f"{devices}gpu", windows, devices=devices, device_kind="GPU", global_batch=32 * devices, **kwargs)


def test_steady_records_leave_out_each_epochs_first_window() -> None:
    records = [window(s, epoch=s // 40) for s in (10, 20, 30, 50, 60)]
    assert [r["global_step"] for r in steady_records(records)] == [20, 30, 60]
    assert [r["global_step"] for r in steady_records(records[:1])] == [10]  # the only one is kept


def test_comm_growing_with_the_scale_is_the_named_cause_with_its_numbers() -> None:
    splits = [
        split_of(8, [window(s, comm=0.004, data=0.002) for s in range(10, 60, 10)]),
        split_of(16, [window(s, comm=0.020, data=0.002) for s in range(10, 60, 10)]),
        split_of(32, [window(s, comm=0.036, data=0.002) for s in range(10, 60, 10)]),
    ]
    bars = waterfall(splits)
    scaling = [b for b in bars if b.kind == "scaling"]
    assert [b.devices for b in scaling] == [16, 32]
    top = scaling[-1]
    assert top.efficiency == pytest.approx(0.106 / 0.138, rel=1e-6)
    assert sum(x.fraction for x in top.losses) == pytest.approx(1 - top.efficiency)
    assert top.losses[0].part == "comm" and top.losses[0].seconds == pytest.approx(0.032)
    found = causes(bars, splits)
    assert [c.part for c in found] == ["comm"]
    assert "32.0 ms more than at the baseline at 32 GPUs" in found[0].evidence
    assert "it grew from 4.0 ms at 8 to 36.0 ms at 32 GPUs" in found[0].hint


def test_a_persistent_slow_node_is_named_by_its_host() -> None:
    slow = dict(slowest=3, excess={"forward": 0.040, "backward": 0.020}, straggler=0.055, comm=0.005)
    splits = [
        split_of(8, [window(s, comm=0.005) for s in range(10, 60, 10)]),
        split_of(16, [window(s, **slow) for s in range(10, 60, 10)], nodes_of_ranks={3: "gpu-n07"}),
    ]
    found = causes(waterfall(splits), splits)
    assert found[0].part == "straggler"
    assert "straggler gpu-n07: rank 3 was the slowest in 4 of 4 windows, 60.0 ms per step" in found[0].evidence
    assert "most in its forward: +40.0 ms" in found[0].evidence and "check gpu-n07" in found[0].hint


def test_jitter_moving_between_ranks_is_not_a_straggler() -> None:
    records = [window(s, slowest=s // 10 % 4, excess={"forward": 0.05}, straggler=0.03) for s in range(10, 90, 10)]
    split = split_of(16, records)
    assert split.slowest_rank is None
    assert all(c.part != "straggler" for c in causes(waterfall([split]), [split]))


def test_a_small_excess_on_one_rank_is_not_a_straggler() -> None:
    records = [window(s, slowest=2, excess={"data": 0.01}, straggler=0.02) for s in range(10, 60, 10)]
    split = split_of(8, records)
    assert split.slowest_rank == 2
    assert all(c.part != "straggler" for c in causes(waterfall([split]), [split]))


def test_the_chance_of_a_persistent_slowest_rank_with_no_slow_rank() -> None:
    assert chance_of_persistence(3, 2, 2) == pytest.approx(1 / 3)  # some rank the slowest in both of 2 windows
    assert chance_of_persistence(3, 4, 4) == pytest.approx(1 / 27)
    assert chance_of_persistence(2, 5, 5) == pytest.approx(1 / 16)  # 2 ranks, 5 of 5: still not 1 in 20
    assert chance_of_persistence(2, 6, 6) == pytest.approx(1 / 32)
    assert chance_of_persistence(4, 6, 4) == pytest.approx(4 * (15 * 9 / 4096 + 6 * 3 / 4096 + 1 / 4096))
    assert chance_of_persistence(64, 10, 9) < 1e-12
    assert chance_of_persistence(1, 5, 5) == 1.0 and chance_of_persistence(8, 0, 0) == 1.0
    assert chance_of_persistence(3, 1, 1) == 1.0  # one window: always some rank


def test_a_moderate_excess_on_few_windows_is_not_told_from_chance() -> None:
    """Six ranks, two steady windows (the first of three left out), the same rank the slowest in both by +50 %
    of the typical rank's own work: chance gives that one time in six; unnamed. At +150 % (two and a half times
    the typical rank's time) it is named."""
    moderate = [window(s, slowest=4, excess={"backward": 0.050}, straggler=0.045) for s in (10, 20, 30)]
    split = split_of(6, moderate, nodes_of_ranks={4: "cn5"})
    assert split.slowest_rank == 4 and split.slowest_chance == pytest.approx(1 / 6)
    assert all(c.part != "straggler" for c in causes(waterfall([split]), [split]))
    strong = [window(s, slowest=4, excess={"backward": 0.150}, straggler=0.140) for s in (10, 20, 30)]
    split = split_of(6, strong, nodes_of_ranks={4: "cn5"})
    found = causes(waterfall([split]), [split])
    assert found[0].part == "straggler" and found[0].nodes == ["cn5"]


def test_a_moderate_excess_over_many_windows_is_named() -> None:
    """The same +50 % on the same rank in 8 of 11 steady windows: chance gives that far less than one time in 20."""
    records = [
        window(s, slowest=4 if s % 40 else s // 40 % 6, excess={"backward": 0.050}, straggler=0.045)
        for s in range(10, 130, 10)
    ]
    split = split_of(6, records, nodes_of_ranks={4: "cn5"})
    assert split.slowest_windows == 8 and split.slowest_chance < 1e-3
    found = causes(waterfall([split]), [split])
    assert found[0].part == "straggler" and "rank 4 was the slowest in 8 of 11 windows" in found[0].evidence


def test_a_single_run_is_measured_against_its_own_compute() -> None:
    split = split_of(4, [window(s, data=0.150, comm=0.002) for s in range(10, 60, 10)], data_workers=2)
    bars = waterfall([split])
    assert [b.kind for b in bars] == ["step"]
    assert bars[0].efficiency == pytest.approx(0.1 / 0.252)
    found = causes(bars, [split])
    assert [c.part for c in found] == ["data"]
    assert "data wait 150.0 ms per step at 4 GPUs (60 % of the step)" in found[0].evidence
    assert "raise data.workers (now 2)" in found[0].hint
    assert predict([split]) == []  # one scale: no growth to extrapolate


def test_slow_log_writes_are_named_as_logging_not_communication() -> None:
    """Rank 0's writes of each log line (0.5 s every 5 steps: TensorBoard on a slow file system) are the log part,
    named with the run's trainer.log_every_steps; exposed communication stays what the all-reduce costs."""
    split = split_of(8, [window(s, log=0.100, comm=0.004) for s in range(10, 60, 10)], log_every=5)
    found = causes(waterfall([split]), [split])
    assert [c.part for c in found] == ["log"]
    assert "log writes (rank 0's records) 100.0 ms per step at 8 GPUs (49 % of the step)" in found[0].evidence
    assert "trainer.log_every_steps (now every 5 steps)" in found[0].hint


def test_a_clean_study_names_no_cause() -> None:
    splits = [split_of(d, [window(s, comm=0.003 + d / 10000) for s in range(10, 60, 10)]) for d in (8, 16, 32)]
    bars = waterfall(splits)
    assert all(x.fraction < MIN_LOSS for b in bars for x in b.losses)
    assert causes(bars, splits) == []


def test_what_if_extrapolates_comm_in_log_devices() -> None:
    splits = [
        split_of(8, [window(s, comm=0.010) for s in range(10, 60, 10)]),
        split_of(16, [window(s, comm=0.020) for s in range(10, 60, 10)]),
    ]
    at32, at64 = predict(splits)
    assert (at32.devices, at64.devices) == (32, 64)
    # comm +10 ms per doubling: 30 ms at 32, 40 ms at 64; baseline step 110 ms
    assert at32.efficiency == pytest.approx(0.110 / 0.130)
    assert at64.efficiency == pytest.approx(0.110 / 0.140)
    assert at64.dominant == "comm" and at64.dominant_loss == pytest.approx(0.030 / 0.140)


def test_a_changed_per_rank_batch_is_compared_per_image() -> None:
    """Twice the devices at the same global batch: half the compute per step is ideal, not a loss."""
    base = split_of(8, [window(s) for s in range(10, 60, 10)])
    half = {p: v / 2 for p, v in COMPUTE.items()}
    records = [window(s, **half, comm=0.01) for s in range(10, 60, 10)]
    for record in records:
        record["ranks"] = 16
    strong = run_split("16gpu", records, devices=16, device_kind="GPU", global_batch=32 * 8)
    bar = waterfall([base, strong])[-1]
    assert bar.ideal_s == pytest.approx(0.050)
    assert bar.losses[0].part == "comm" and bar.efficiency == pytest.approx(0.05 / 0.06)
