"""StepClock: laps on the CPU add up to the window's wall time; the DDP hook is only for DDP; CUDA events."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain.contract.step_split import MEASURED
from hpctrain.task.step_timer import NoClock, StepClock


def test_cpu_laps_add_up_to_the_wall_time_and_go_to_their_parts() -> None:
    clock = StepClock(torch.device("cpu"))
    for _ in range(3):
        time.sleep(0.01)
        clock.lap("data")
        time.sleep(0.02)
        clock.lap("forward")
        clock.step_done()
    sums, wall = clock._seconds()
    by_part = dict(zip(MEASURED, sums))
    assert by_part["data"] >= 0.03 and by_part["forward"] >= 0.06
    assert sum(sums) == pytest.approx(wall, abs=0.002)
    record = clock.window(global_step=3, epoch=0)
    assert record is not None and record["steps"] == 3 and record["ranks"] == 1
    assert record["forward_s"] == pytest.approx(by_part["forward"] / 3, abs=1e-5)


def test_the_backward_splits_at_the_last_bucket_handed_over() -> None:
    clock = StepClock(torch.device("cpu"))
    time.sleep(0.01)
    clock._grads_handed = time.perf_counter()  # what the comm hook notes
    time.sleep(0.02)
    clock.backward_done()
    by_part = dict(zip(MEASURED, clock.sums))
    assert 0.009 <= by_part["backward"] < 0.02 and by_part["comm"] >= 0.019
    clock.backward_done()  # no hand-over (no DDP): all backward
    assert clock.sums[MEASURED.index("comm")] == by_part["comm"]


def test_an_empty_window_gives_no_record_and_the_no_clock_does_nothing() -> None:
    assert StepClock(torch.device("cpu")).window(global_step=0, epoch=0) is None
    NoClock().lap("data")
    NoClock().backward_done()


def test_only_a_ddp_model_gets_the_comm_hook() -> None:
    assert StepClock(torch.device("cpu")).watch_ddp(nn.Linear(2, 2)) is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_events_are_read_once_at_the_windows_end() -> None:
    clock = StepClock(torch.device("cuda"))
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(2):
        clock.lap("data")
        for _ in range(10):
            x = x @ x / 2048
        clock.lap("forward")
        clock.step_done()
    sums, wall = clock._seconds()
    by_part = dict(zip(MEASURED, sums))
    assert by_part["forward"] > by_part["data"] >= 0
    assert sum(sums) == pytest.approx(wall, rel=0.01)


@pytest.mark.usefixtures("task_local")
def test_your_own_loop_logs_its_split_for_the_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """task.StepTimer in a script's loop: one step_split record per log(), which the report explains."""
    from hpctrain import task
    from hpctrain.contract import script_env
    from hpctrain.contract.metrics import parse_metric_lines
    from hpctrain.contract.rundir import metrics_path
    from hpctrain.observe.report.build import report

    run = tmp_path / "run"
    run.mkdir()
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", script_env.RUN_DIR_VAR: str(run)}.items():
        monkeypatch.setenv(name, value)
    timer = task.StepTimer(nn.Linear(2, 2))  # not DDP: nothing to watch
    for step in range(1, 9):
        time.sleep(0.02)
        timer.lap("data")
        time.sleep(0.005)
        timer.lap("forward")
        timer.step_done()
        if step % 2 == 0:
            task.log(step, epoch=0, loss=1.0)
            record = timer.log(step)
            assert record is not None and record["steps"] == 2
    lines = metrics_path(run).read_bytes().splitlines(keepends=True)
    splits, _ = parse_metric_lines(lines, kinds=("step_split",))
    assert [r["global_step"] for r in splits] == [2, 4, 6, 8]
    causes = report([run], out=tmp_path / "report").as_json()["waterfall"]["causes"]
    assert causes[0]["part"] == "data" and "per step at 1 process" in causes[0]["evidence"]
