"""An async save's staging copies into buffers kept from save to save, made anew when the state's layout changes."""

from __future__ import annotations

import torch

from hpctrain.task.writing import Staging


def test_staging_reuses_its_buffers_and_copies_the_current_values() -> None:
    staging = Staging()
    state = {"model": {"w": torch.ones(3, 2)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    first = staging.stage(state)
    buffer = first["model.w"]  # DCP's flat keys
    assert buffer.data_ptr() != state["model"]["w"].data_ptr() and torch.equal(buffer, torch.ones(3, 2))

    state["model"]["w"].add_(1)
    state["optimizer"]["param_groups"][0]["lr"] = 0.05
    second = staging.stage(state)
    assert second["model.w"].data_ptr() == buffer.data_ptr()  # the same memory: a copy, no allocation
    assert torch.equal(second["model.w"], torch.full((3, 2), 2.0))
    assert second["optimizer.param_groups.0.lr"] == 0.05  # plain values are the current ones


def test_a_changed_layout_gets_new_buffers() -> None:
    staging = Staging()
    before = staging.stage({"model": {"w": torch.ones(3)}, "optimizer": {"state": {}}})["model.w"]
    grown = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {"w": {"momentum_buffer": torch.zeros(3)}}}}
    staged = staging.stage(grown)  # an optimizer that created its state at its first step
    assert torch.equal(staged["optimizer.state.w.momentum_buffer"], torch.zeros(3))
    assert staged["model.w"].data_ptr() != before.data_ptr()
    reshaped = staging.stage({"model": {"w": torch.arange(4.0)}, "optimizer": {"state": {}}})
    assert torch.equal(reshaped["model.w"], torch.arange(4.0))


def test_every_tensor_is_copied_whatever_stream_copies_it() -> None:
    torch.manual_seed(0)
    state = {f"t{i}": torch.randn(i + 1, 5) for i in range(9)}
    state.update(step=torch.tensor(7), flags=torch.tensor([True, False]), half=torch.randn(4).half())
    staging = Staging()
    staged = staging.stage(state)
    for key, value in state.items():
        assert staged[key] is not value and torch.equal(staged[key], value), key
        value.zero_() if value.dtype != torch.bool else value.logical_not_()  # the loop goes on
    assert torch.equal(staged["t8"], torch.zeros(9, 5)) is False  # the copy kept the values of save time
    again = staging.stage(state)
    assert all(torch.equal(again[key], value) for key, value in state.items())
    staging.close()
