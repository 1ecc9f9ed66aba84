"""A task checkpoint folder is untrusted input: what a crafted one may claim is judged before anything is read
or allocated (checkpoint_check.py with dcp_io.check_storage and SafeReader), and it is skipped for the previous one.

Each test writes the hostile folder itself, as an attacker with write access to the checkpoint directory
would: it rewrites DCP's ``.metadata`` with DCP's own classes and ``meta.json``'s record to match, so only
hpctrain's checks stand between the folder and ``torch.load``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hpctrain import task
from hpctrain.contract.rundir import META_FILE
from hpctrain.errors import CheckpointError
from hpctrain.task import torch_archive
from hpctrain.task.dcp_io import METADATA_FILE, UnsafeCheckpoint, from_blob, load_metadata

pytestmark = pytest.mark.usefixtures("task_local")

BIG = 64 << 20  # what a crafted value would make the loader allocate or inflate


def parts(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optimizer": optimizer, "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2)}


def rewrite(folder: Path, change: Callable[[Any, dict[str, Any]], None]) -> None:
    """Apply ``change(metadata, meta)`` to the folder's DCP metadata and meta.json, and make the record match."""
    metadata = load_metadata(folder / METADATA_FILE)
    meta = json.loads((folder / META_FILE).read_text())
    change(metadata, meta)
    data = pickle.dumps(metadata)
    (folder / METADATA_FILE).write_bytes(data)
    meta["files"][METADATA_FILE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / META_FILE).write_text(json.dumps(meta))


def place(folder: Path, key: str, value: bytes) -> Callable[[Any, dict[str, Any]], None]:
    """A change that appends ``value`` to ``key``'s data file and points ``key``'s record at it."""

    def change(metadata: Any, meta: dict[str, Any]) -> None:
        [info] = [info for index, info in metadata.storage_data.items() if index.fqn == key]
        path = folder / info.relative_path
        info.offset, info.length = path.stat().st_size, len(value)
        with open(path, "ab") as handle:
            handle.write(value)
        meta["files"][info.relative_path]["size"] = path.stat().st_size

    return change


def deflated_archive(nbytes: int) -> bytes:
    """An archive laid out as torch.save writes one, but its records deflated: ``nbytes`` of zeros in a few KB."""
    saved = io.BytesIO()
    torch.save(torch.zeros(nbytes, dtype=torch.uint8), saved)
    crafted = io.BytesIO()
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(crafted, "w", zipfile.ZIP_DEFLATED) as target:
        for record in source.infolist():
            target.writestr(record.filename, source.read(record.filename))
    return crafted.getvalue()


def blob_claims(size: int) -> Callable[[Any, dict[str, Any]], None]:
    def change(metadata: Any, meta: dict[str, Any]) -> None:
        entry = metadata.state_dict_metadata["scheduler"]
        entry.size = entry.chunks[0].sizes = torch.Size([size])

    return change


def outside_path(metadata: Any, meta: dict[str, Any]) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = "../../secret"


def zstd_transform(metadata: Any, meta: dict[str, Any]) -> None:
    next(iter(metadata.storage_data.values())).transform_descriptors = ["zstd"]


CRAFTS = {
    "a blob claiming 64 MiB": (lambda folder: blob_claims(BIG), "claims 67108864 bytes"),
    "values placed outside the folder": (lambda folder: outside_path, "not one of the folder's data files"),
    "a value to decompress": (lambda folder: zstd_transform, "stored through ['zstd']"),
    "a deflated record": (lambda folder: place(folder, "scheduler", deflated_archive(BIG)), "is compressed"),
}


@pytest.mark.parametrize("craft", list(CRAFTS))
def test_a_crafted_folder_is_skipped_for_the_previous_before_anything_is_read(
    craft: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make, said = CRAFTS[craft]
    found = parts()
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=3, **found)
    ckpt.save(2)
    expected = {k: v.clone() for k, v in found["model"].state_dict().items()}
    found["model"].weight.data.add_(1.0)
    crafted = ckpt.save(4)
    (tmp_path / "secret").write_bytes(b"not the run's")
    rewrite(crafted, make(crafted))

    fresh = parts(seed=5)
    with caplog.at_level(logging.WARNING):
        assert task.Checkpointer(tmp_path / "ckpt", **fresh).load() == 2
    assert f"skipping damaged checkpoint {crafted}" in caplog.text and said in caplog.text
    assert all(torch.equal(fresh["model"].state_dict()[k], v) for k, v in expected.items())
    assert crafted.is_dir()  # kept: the user decides


def test_when_every_folder_is_unusable_the_load_fails_naming_each_and_keeps_them(tmp_path: Path) -> None:
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=3, **parts())
    first, second = ckpt.save(1), ckpt.save(2)
    rewrite(first, outside_path)
    (second / METADATA_FILE).write_bytes(b"\x80\x04" + b"(" * 200_000)  # deep nesting: not metadata
    rewrite_record = json.loads((second / META_FILE).read_text())
    data = (second / METADATA_FILE).read_bytes()
    rewrite_record["files"][METADATA_FILE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (second / META_FILE).write_text(json.dumps(rewrite_record))
    model = parts(seed=9)["model"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as raised:
        task.Checkpointer(tmp_path / "ckpt", model=model).load()
    message = str(raised.value)
    assert "no usable checkpoint" in message and "step-00000001: unsafe" in message and "step-00000002:" in message
    assert "each was kept" in (raised.value.hint or "") and first.is_dir() and second.is_dir()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_a_blob_is_judged_before_it_is_unpickled() -> None:
    bomb = torch.frombuffer(bytearray(deflated_archive(BIG)), dtype=torch.uint8)
    with pytest.raises(UnsafeCheckpoint, match="is compressed"):
        from_blob(bomb, "scheduler")
    with pytest.raises(UnsafeCheckpoint, match="scheduler is not an archive torch.save writes"):
        from_blob(torch.zeros(100, dtype=torch.uint8), "scheduler")  # not an archive at all


def test_state_too_large_to_load_safely_is_refused_when_it_is_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch_archive, "MAX_PICKLE_BYTES", 1 << 20)  # 64 MiB in the product: 1 MiB, quicker

    class Huge:
        def state_dict(self) -> dict[str, Any]:
            return {"seen": list(range(400_000))}  # a pickle past the loader's bound

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    ckpt = task.Checkpointer(tmp_path / "ckpt", huge=Huge())
    with pytest.raises(CheckpointError, match="cannot checkpoint the state of huge: its pickle is") as raised:
        ckpt.save(1)
    assert "torch.tensor" in (raised.value.hint or "") and ckpt.checkpoints() == []
