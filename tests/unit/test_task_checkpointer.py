"""hpctrain.task.Checkpointer in one process: round trip, damaged and foreign folders, unsafe files, bad parts.

The multi-rank behaviour (resharding 4 -> 2 and 6 ranks, a save not every rank
joins, exact resume of a stopped loop) is tests/local/test_task_resume.py's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from hpctrain import task
from hpctrain.contract.rundir import META_FILE
from hpctrain.contract.step_folders import StepFolders
from hpctrain.errors import CheckpointError
from hpctrain.task import session as task_session

pytestmark = pytest.mark.usefixtures("task_local")


def parts(seed: int = 0, width: int = 6) -> dict[str, object]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def train(found: dict[str, object], steps: int) -> None:
    model, optimizer, scheduler = found["model"], found["optimizer"], found["scheduler"]
    for _ in range(steps):
        model(torch.randn(8, 4)).square().mean().backward()  # type: ignore[operator]
        optimizer.step()  # type: ignore[attr-defined]
        scheduler.step()  # type: ignore[attr-defined]
        optimizer.zero_grad()  # type: ignore[attr-defined]


def weights(model: object) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]


def test_round_trip_restores_every_part_and_the_rng(tmp_path: Path) -> None:
    saved = parts()
    train(saved, 3)
    ckpt = task.Checkpointer(tmp_path / "ckpt", **saved)
    path = ckpt.save(3)
    after_save = torch.rand(4)  # the RNG stream right after the save

    loaded = parts(seed=7)
    other = task.Checkpointer(tmp_path / "ckpt", **loaded)
    assert other.load() == 3 and other.last_loaded == path
    for key, value in weights(saved["model"]).items():
        assert torch.equal(weights(loaded["model"])[key], value), key
    assert loaded["optimizer"].state_dict()["state"][0]["step"] == 3  # type: ignore[attr-defined]
    assert loaded["scheduler"].state_dict() == saved["scheduler"].state_dict()  # type: ignore[attr-defined]
    assert torch.equal(torch.rand(4), after_save)  # the RNG continues where the save left it
    meta = json.loads((path / META_FILE).read_text())
    assert meta["layout"] == "dcp" and meta["format"] == "hpctrain-task" and meta["world_size"] == 1
    assert meta["parts"] == {"model": "module", "optimizer": "optimizer", "scheduler": "object"}


def test_a_fresh_directory_loads_nothing_and_keep_last_prunes(tmp_path: Path) -> None:
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=2, every_steps=2, **parts())
    assert ckpt.load() == 0
    saved = [step for step in range(1, 8) if ckpt.maybe_save(step)]
    assert saved == [2, 4, 6] and not ckpt.maybe_save(6)
    assert [p.name for p in ckpt.checkpoints()] == ["step-00000004", "step-00000006"]


def test_a_torn_or_damaged_newest_folder_is_skipped_for_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    found = parts()
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=5, **found)
    ckpt.save(2)
    expected = weights(found["model"])
    train(found, 1)
    torn = ckpt.save(4)
    data = next(torn.glob("*.distcp"))
    os.truncate(data, data.stat().st_size - 10)  # a rank's file cut short: not complete
    damaged = ckpt.save(6)
    (damaged / ".metadata").write_bytes(b"\x00" * (damaged / ".metadata").stat().st_size)  # same size, other bytes

    fresh = parts(seed=3)
    with caplog.at_level(logging.WARNING):
        assert task.Checkpointer(tmp_path / "ckpt", **fresh).load() == 2
    assert "skipping damaged checkpoint" in caplog.text and damaged.name in caplog.text
    assert all(torch.equal(weights(fresh["model"])[k], v) for k, v in expected.items())
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        task.Checkpointer(tmp_path / "ckpt", **parts()).load(damaged)  # asked for by name: an error


def test_another_models_checkpoint_names_the_keys_and_loads_nothing(tmp_path: Path) -> None:
    task.Checkpointer(tmp_path / "ckpt", **parts()).save(5)
    other = parts(seed=1, width=8)  # the hidden layer is wider
    other["model"].add_module("3", nn.Linear(3, 3))  # type: ignore[union-attr]
    other["extra"] = torch.optim.lr_scheduler.StepLR(other["optimizer"], step_size=9)  # type: ignore[arg-type]
    before = weights(other["model"])
    with pytest.raises(CheckpointError) as raised:
        task.Checkpointer(tmp_path / "ckpt", **other).load()
    message = str(raised.value)
    assert "step-00000005 does not fit" in message and "nothing was loaded" in message
    assert "model: missing keys 3.bias, 3.weight" in message and "optimizer:" not in message
    assert "0.weight is [6, 4] there, [8, 4] here" in message
    assert "part 'extra' is not in it" in message and "holds parts: model, optimizer, rng, scheduler" in message
    assert all(torch.equal(weights(other["model"])[k], v) for k, v in before.items())


def test_trainer_checkpoints_in_the_folder_are_not_silently_ignored(tmp_path: Path) -> None:
    folders = StepFolders(tmp_path / "ckpt", layout="state.pt", keep_last=2)
    tmp = folders.begin(3)
    torch.save({"model": {}}, tmp / "state.pt")
    folders.commit(tmp, 3, files={"state.pt": {"size": (tmp / "state.pt").stat().st_size}}, info={})
    with pytest.raises(CheckpointError, match="checkpoints of another kind"):
        task.Checkpointer(tmp_path / "ckpt", **parts()).load()


def test_metadata_that_would_run_code_is_refused_before_it_runs(tmp_path: Path) -> None:
    path = task.Checkpointer(tmp_path / "ckpt", **parts()).save(1)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    evil = pickle.dumps(Evil())
    (path / ".metadata").write_bytes(evil)
    meta = json.loads((path / META_FILE).read_text())  # an attacker rewrites the record too
    meta["files"][".metadata"] = {"size": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}
    (path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="no usable checkpoint .*step-00000001: unsafe: .*refers to posix.system"):
        task.Checkpointer(tmp_path / "ckpt", **parts()).load()  # skipped like damage; none left: an error
    assert not marker.exists() and path.is_dir()  # nothing ran, nothing removed


class NotStateful:
    pass


def test_what_cannot_be_checkpointed_is_refused_at_registration(tmp_path: Path) -> None:
    found = parts()
    with pytest.raises(CheckpointError, match=r"data=.*NotStateful has no state_dict\(\) and load_state_dict\(\)"):
        task.Checkpointer(tmp_path, model=found["model"], data=NotStateful())
    with pytest.raises(CheckpointError, match="updates parameters of no registered model"):
        task.Checkpointer(tmp_path, optimizer=found["optimizer"])
    with pytest.raises(CheckpointError, match="cannot name a part"):
        task.Checkpointer(tmp_path, rng=found["scheduler"])
    ckpt = task.Checkpointer(tmp_path, model=found["model"])
    with pytest.raises(CheckpointError, match="registered already"):
        ckpt.register("model", found["model"])


class Holder:
    def __init__(self, value: object) -> None:
        self.value = value

    def state_dict(self) -> dict[str, object]:
        return {"inner": {"value": self.value}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.value = state["inner"]["value"]  # type: ignore[index]


def test_plain_state_keeps_its_types_and_refuses_what_would_not_load_safely(tmp_path: Path) -> None:
    kept = Holder({1: (2.5, "x", None), "t": torch.arange(3)})
    task.Checkpointer(tmp_path / "a", holder=kept).save(1)
    back = Holder(None)
    task.Checkpointer(tmp_path / "a", holder=back).load()
    assert back.value.keys() == {1, "t"} and back.value[1] == (2.5, "x", None)  # type: ignore[union-attr]
    assert torch.equal(back.value["t"], torch.arange(3))  # type: ignore[index]
    with pytest.raises(CheckpointError, match=r"holder\['inner'\]\['value'\] of type ndarray"):
        task.Checkpointer(tmp_path / "b", holder=Holder(np.zeros(3))).save(1)


def test_an_async_save_copies_the_state_at_save_time(tmp_path: Path) -> None:
    found = parts()
    ckpt = task.Checkpointer(tmp_path / "ckpt", async_save=True, **found)
    ckpt.save(1)
    expected = weights(found["model"])
    with torch.no_grad():
        for parameter in found["model"].parameters():  # type: ignore[attr-defined]
            parameter.fill_(99.0)  # training goes on while the writer runs
    ckpt.wait()
    assert [p.name for p in ckpt.checkpoints()] == ["step-00000001"]
    fresh = parts(seed=2)
    task.Checkpointer(tmp_path / "ckpt", **fresh).load()
    assert all(torch.equal(weights(fresh["model"])[k], v) for k, v in expected.items())


def test_a_checkpoint_directory_that_cannot_be_made_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the folder should be")
    with pytest.raises(CheckpointError, match="cannot make a checkpoint folder under .*taken"):
        task.Checkpointer(tmp_path / "taken", **parts()).save(1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_model_round_trips_with_its_cuda_generator(tmp_path: Path) -> None:
    """On a GPU: state on the device, the CUDA RNG saved and restored, an async save staged to pinned memory."""
    found = parts()
    found["model"].cuda()  # type: ignore[union-attr]
    found["optimizer"] = torch.optim.AdamW(found["model"].parameters(), lr=0.01)  # type: ignore[union-attr]
    found["scheduler"] = torch.optim.lr_scheduler.StepLR(found["optimizer"], step_size=2)  # type: ignore[arg-type]
    train_on = found["model"]
    train_on(torch.randn(8, 4, device="cuda")).square().mean().backward()  # type: ignore[operator]
    found["optimizer"].step()  # type: ignore[attr-defined]
    task_session.reset()
    ckpt = task.Checkpointer(tmp_path / "ckpt", async_save=True, **found)
    ckpt.save(1)
    ckpt.wait()
    after_save = torch.rand(3, device="cuda")
    fresh = parts(seed=5)
    fresh["model"].cuda()  # type: ignore[union-attr]
    fresh["optimizer"] = torch.optim.AdamW(fresh["model"].parameters(), lr=0.01)  # type: ignore[union-attr]
    fresh["scheduler"] = torch.optim.lr_scheduler.StepLR(fresh["optimizer"], step_size=2)  # type: ignore[arg-type]
    assert task.Checkpointer(tmp_path / "ckpt", **fresh).load() == 1
    for key, value in weights(found["model"]).items():
        assert torch.equal(weights(fresh["model"])[key], value) and value.is_cuda, key
    assert torch.equal(torch.rand(3, device="cuda"), after_save)


def test_a_folder_named_through_a_symlink_is_used_where_it_is(tmp_path: Path) -> None:
    (tmp_path / "scratch" / "ckpt").mkdir(parents=True)
    (tmp_path / "work" / "run").mkdir(parents=True)
    link = tmp_path / "work" / "run" / "ckpt"
    link.symlink_to(tmp_path / "scratch" / "ckpt")  # checkpoints on scratch space, outside work/
    task.Checkpointer(link, **parts()).save(3)
    assert task.Checkpointer(link, **parts(seed=2)).load() == 3


def test_the_runs_checkpoint_dir_linked_out_of_the_run_is_refused_never_started_over(tmp_path: Path) -> None:
    scratch = tmp_path.parent / f"{tmp_path.name}-scratch"
    scratch.mkdir()
    (tmp_path / "checkpoints").symlink_to(scratch)  # RUN/checkpoints -> scratch, a common set-up
    ckpt = task.Checkpointer(**parts())
    for call in (ckpt.load, lambda: ckpt.save(1), ckpt.checkpoints):
        with pytest.raises(CheckpointError, match="never be listed, loaded or pruned") as raised:
            call()
        assert f"Checkpointer(directory={str(scratch)!r})" in (raised.value.hint or "")
    task.Checkpointer(scratch, **parts()).save(4)  # named where it is, the folder is followed by every call
    assert task.Checkpointer(scratch, **parts(seed=1)).load() == 4 and not list(Path(tmp_path).glob(".tmp-*"))


def test_a_folder_whose_name_claims_another_step_is_never_loaded_as_that_step(tmp_path: Path) -> None:
    saved = task.Checkpointer(tmp_path / "ckpt", **parts()).save(6)
    for name in ("step-" + "9" * 21, "step-00000099", "step-\u0661\u0660\u0660"):  # meta.json says 6 in each
        shutil.copytree(saved, saved.parent / name)
    ckpt = task.Checkpointer(tmp_path / "ckpt", **parts(seed=1))
    assert ckpt.load() == 6 and ckpt.last_loaded == saved and ckpt.checkpoints() == [saved]


def test_a_model_whose_own_names_differ_from_the_checkpoints_loads_through_dcps_names(tmp_path: Path) -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 3))
    task.Checkpointer(tmp_path / "ckpt", model=plain).save(1)
    torch.manual_seed(1)
    wrapped = nn.Sequential(nn.Linear(4, 6), torch.compile(nn.Linear(6, 3)))  # its own keys: 1._orig_mod.weight
    assert "1._orig_mod.weight" in wrapped.state_dict()
    assert task.Checkpointer(tmp_path / "ckpt", model=wrapped).load() == 1  # DCP names it 1.weight, as saved
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), wrapped.state_dict().values()))
