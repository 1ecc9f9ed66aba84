"""An async save's staging copies into buffers kept from save to save, made anew when the state's layout changes."""

from __future__ import annotations

from pathlib import Path

import torch

from hpctrain.task.staging import StagingWriter


def test_staging_reuses_its_buffers_and_copies_the_current_values(tmp_path: Path) -> None:
    writer = StagingWriter(tmp_path)
    state = {"model": {"w": torch.ones(3, 2)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    first = writer.stage(state)
    buffer = first["model"]["w"]
    assert buffer.data_ptr() != state["model"]["w"].data_ptr() and torch.equal(buffer, torch.ones(3, 2))

    state["model"]["w"].add_(1)
    state["optimizer"]["param_groups"][0]["lr"] = 0.05
    second = writer.stage(state)
    assert second["model"]["w"].data_ptr() == buffer.data_ptr()  # the same memory: a copy, no allocation
    assert torch.equal(second["model"]["w"], torch.full((3, 2), 2.0))
    assert second["optimizer"]["param_groups"][0]["lr"] == 0.05  # plain values are the current ones


def test_a_changed_layout_gets_new_buffers(tmp_path: Path) -> None:
    writer = StagingWriter(tmp_path)
    before = writer.stage({"model": {"w": torch.ones(3)}, "optimizer": {"state": {}}})["model"]["w"]
    grown = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {"w": {"momentum_buffer": torch.zeros(3)}}}}
    staged = writer.stage(grown)  # an optimizer that created its state at its first step
    assert torch.equal(staged["optimizer"]["state"]["w"]["momentum_buffer"], torch.zeros(3))
    assert staged["model"]["w"].data_ptr() != before.data_ptr()
    reshaped = writer.stage({"model": {"w": torch.arange(4.0)}, "optimizer": {"state": {}}})
    assert torch.equal(reshaped["model"]["w"], torch.arange(4.0))
