"""How a save reaches the disk: the async save's copy into kept buffers (made anew when the state's layout
changes), the background write whose failure is raised at wait(), the pruning that never fails a save."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader

from hpctrain import task
from hpctrain.errors import CheckpointError
from hpctrain.task import writing
from hpctrain.task.writing import Staging


def test_staging_reuses_its_buffers_and_copies_the_current_values() -> None:
    staging = Staging()
    state = {"model": {"w": torch.ones(3, 2)}, "optimizer": {"param_groups": [{"lr": 0.1}]}}
    first = staging.stage(state)
    buffer = first["model"]["w"]  # DCP's flat keys, grouped by part
    assert buffer.data_ptr() != state["model"]["w"].data_ptr() and torch.equal(buffer, torch.ones(3, 2))

    state["model"]["w"].add_(1)
    state["optimizer"]["param_groups"][0]["lr"] = 0.05
    second = staging.stage(state)
    assert second["model"]["w"].data_ptr() == buffer.data_ptr()  # the same memory: a copy, no allocation
    assert torch.equal(second["model"]["w"], torch.full((3, 2), 2.0))
    assert second["optimizer"]["param_groups.0.lr"] == 0.05  # plain values are the current ones


def test_a_changed_layout_gets_new_buffers() -> None:
    staging = Staging()
    before = staging.stage({"model": {"w": torch.ones(3)}, "optimizer": {"state": {}}})["model"]["w"]
    grown = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {"w": {"momentum_buffer": torch.zeros(3)}}}}
    staged = staging.stage(grown)  # an optimizer that created its state at its first step
    assert torch.equal(staged["optimizer"]["state.w.momentum_buffer"], torch.zeros(3))
    assert staged["model"]["w"].data_ptr() != before.data_ptr()
    reshaped = staging.stage({"model": {"w": torch.arange(4.0)}, "optimizer": {"state": {}}})
    assert torch.equal(reshaped["model"]["w"], torch.arange(4.0))


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


@pytest.mark.usefixtures("task_local")
def test_a_failed_prune_is_a_warning_and_the_save_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model = nn.Linear(3, 2)
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=1, model=model)
    ckpt.save(1)

    def refuse(*args: object) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(ckpt.folders, "prune", refuse)
    with caplog.at_level(logging.WARNING):
        ckpt.save(2)  # the prune runs after the save returned: its failure cannot fail the save
        assert [p.name for p in ckpt.checkpoints()] == ["step-00000001", "step-00000002"]
    assert "removing older checkpoints failed: read-only" in caplog.text


@pytest.mark.usefixtures("task_local")
def test_an_async_write_that_fails_raises_at_wait_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = nn.Linear(3, 2)
    ckpt = task.Checkpointer(tmp_path / "ckpt", async_save=True, model=model)

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writing.dcp, "save", full_disk)
    ckpt.save(3)  # returns once the state is copied: the write fails in the background
    with pytest.raises(CheckpointError, match="save of checkpoint step 3 .* No space left on device"):
        ckpt.wait()
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == []  # the temp folder removed
    ckpt.wait()  # reported once


@pytest.mark.usefixtures("task_local")
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_folder_it_writes_loads_with_dcps_own_reader(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    path = task.Checkpointer(tmp_path / "ckpt", model=model, optimizer=optimizer).save(1)

    torch.manual_seed(1)
    fresh = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 3))
    state = {"model": fresh.state_dict()}
    dcp.load(state, storage_reader=FileSystemReader(path), no_dist=True)  # DCP's reader: one archive per value
    assert all(torch.equal(state["model"][key], value) for key, value in model.state_dict().items())
