"""data_wait_fraction: the share of train time spent blocked on the next batch, per window and per epoch."""

from __future__ import annotations

import pytest
import torch

from hpctrain.trainer.state import StepWindow
from hpctrain.trainer.strategies.hogwild import _Window


def test_step_window_divides_waiting_by_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 110.0, 110.0])
    monkeypatch.setattr("hpctrain.trainer.state.time.perf_counter", lambda: next(clock))
    window = StepWindow()  # started at 100 s
    window.add(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), data_s=2.5, images=4)
    window.add(None, data_s=0.5, images=4)
    assert window.data_wait_fraction() == pytest.approx(0.3)  # 3 s of 10
    values = window.values(world_size=1, lr=0.1)
    assert values["data_wait_fraction"] == pytest.approx(0.3) and values["step_s"] == pytest.approx(5.0)


def test_hogwild_window_weighs_workers_by_their_time() -> None:
    window = _Window()
    window.add(0, {"sums": [1.0, 1.0, 1.0, 8.0], "data_s": 1.0, "elapsed_s": 2.0, "lr": 0.1}, steps=1)
    window.add(1, {"sums": [1.0, 1.0, 1.0, 8.0], "data_s": 0.0, "elapsed_s": 6.0, "lr": 0.1}, steps=1)
    assert window.values()["data_wait_fraction"] == pytest.approx(1.0 / 8.0)
    assert _Window().data_wait_fraction() == 0.0
