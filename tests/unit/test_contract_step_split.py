"""split_record: every rank's lapped sums -> one window's parts, which add up to the mean step time."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.contract.metrics import MetricsTail, append_metrics
from hpctrain.contract.rundir import metrics_path
from hpctrain.contract.step_split import MEASURED, PARTS, brief, parts_of, split_record


def sums(**seconds: float) -> dict[str, float]:
    return {part: seconds.get(part, 0.0) for part in MEASURED}


def test_parts_add_up_to_the_mean_step_time() -> None:
    ranks = [
        sums(data=1.0, forward=3.0, backward=6.0, comm=2.0, optimizer=0.5, other=0.5, sync=0.1),
        sums(data=1.2, forward=3.1, backward=5.8, comm=1.9, optimizer=0.4, other=0.6, sync=0.2),
    ]
    walls = [sum(r.values()) for r in ranks]
    record = split_record(ranks, walls, 10, global_step=40, epoch=1)
    assert sum(parts_of(record).values()) == pytest.approx(record["step_s"], rel=1e-4)
    assert record["step_s"] == pytest.approx(sum(walls) / 2 / 10, rel=1e-4)
    assert record["ranks"] == 2 and record["steps"] == 10 and record["global_step"] == 40


def test_one_slow_rank_is_straggler_wait_not_forward() -> None:
    """Seven ranks wait 30 s over the window for rank 5's slow forward; the typical rank's forward is the part."""
    typical = dict(data=2.0, forward=10.0, backward=20.0, optimizer=2.0)
    ranks = [sums(**typical, comm=34.0) for _ in range(8)]
    ranks[5] = sums(**{**typical, "forward": 40.0}, comm=4.0)
    walls = [68.0] * 8
    record = split_record(ranks, walls, 20, global_step=20, epoch=0)
    assert record["slowest_rank"] == 5
    assert record["forward_s"] == pytest.approx(0.5)
    assert record["straggler_s"] == pytest.approx(1.5)
    assert record["comm_s"] == pytest.approx(0.2)
    assert record["slowest_forward_s"] == pytest.approx(1.5) and record["slowest_data_s"] == 0


def test_one_rank_has_no_straggler_and_its_stop_check_is_loop_time() -> None:
    record = split_record([sums(data=0.3, forward=0.3, backward=0.3, sync=0.1)], [1.0], 4, global_step=4, epoch=0)
    assert record["straggler_s"] == 0 and record["comm_s"] == 0
    assert record["data_s"] == pytest.approx(0.075) and record["other_s"] == pytest.approx(0.025)


def test_a_wall_shorter_than_the_split_implies_trims_straggler_first() -> None:
    ranks = [sums(forward=1.0), sums(forward=2.0)]
    record = split_record(ranks, [1.5, 1.5], 1, global_step=1, epoch=0)
    assert record["comm_s"] == 0 and record["straggler_s"] == pytest.approx(0.5)
    assert sum(parts_of(record).values()) == pytest.approx(1.5)


def test_a_checkpoint_on_rank_0_stalls_every_rank() -> None:
    ranks = [sums(forward=1.0, checkpoint=3.0), sums(forward=1.0, comm=3.0)]
    record = split_record(ranks, [4.0, 4.0], 2, global_step=2, epoch=0)
    assert record["checkpoint_s"] == pytest.approx(1.5) and record["comm_s"] == pytest.approx(0.0, abs=1e-9)


def test_rank_0s_log_writes_are_their_own_part_not_communication() -> None:
    """Rank 0 writes the window's records (2 s over the window, TensorBoard on a slow file system); the other
    three ranks wait for it in their next collective (sync), beside 0.5 s of real exposed communication."""
    ranks = [sums(forward=4.0, comm=0.5, log=2.0)] + [sums(forward=4.0, comm=0.5, sync=2.0) for _ in range(3)]
    record = split_record(ranks, [6.5] * 4, 10, global_step=10, epoch=0)
    assert record["log_s"] == pytest.approx(0.2) and record["comm_s"] == pytest.approx(0.05)
    assert record["straggler_s"] == 0 and record["slowest_rank"] in range(4)
    assert sum(parts_of(record).values()) == pytest.approx(record["step_s"]) == pytest.approx(0.65)
    assert "log 31%" in (brief(record) or "")
    assert parts_of({"forward_s": 0.5})["log"] == 0.0  # a record written before the part existed


def test_parts_of_reads_damaged_fields_as_zero() -> None:
    parts = parts_of({"data_s": None, "comm_s": -1, "forward_s": 0.2})
    assert set(parts) == set(PARTS) and parts["forward"] == 0.2 and parts["data"] == 0 and parts["comm"] == 0


def test_no_rank_or_no_step_is_an_error() -> None:
    with pytest.raises(ValueError):
        split_record([], [], 1, global_step=0, epoch=0)
    with pytest.raises(ValueError):
        split_record([sums()], [1.0], 0, global_step=0, epoch=0)


def test_brief_names_the_parts_largest_first_and_the_slowest_rank() -> None:
    record = {"forward_s": 0.21, "backward_s": 0.43, "comm_s": 0.22, "straggler_s": 0.07, "data_s": 0.04}
    record |= {"h2d_s": 0.03, "other_s": 0.001, "slowest_rank": 5}
    assert brief(record) == "bwd 43% comm 22% fwd 21% straggler(rank 5) 7% data 4% copy 3%"
    assert brief({"forward_s": 0}) is None


def test_the_live_tail_keeps_the_newest_split(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for step in (2, 4):
        append_metrics(run, {"kind": "step_split", "global_step": step, "epoch": 0, "forward_s": 0.1}, now=1.0)
    tail = MetricsTail(metrics_path(run))
    tail.read()
    assert tail.last_split is not None and tail.last_split["global_step"] == 4 and not tail.steps
