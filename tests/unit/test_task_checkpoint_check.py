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
import time
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

from hpctrain import task
from hpctrain.contract.rundir import META_FILE
from hpctrain.contract.step_folders import MAX_EXAMINED
from hpctrain.errors import CheckpointError
from hpctrain.task import dcp_io, torch_archive
from hpctrain.task.checkpoint_check import MIN_RANK_FILE_BYTES, saved_ranks
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


def size_beyond_chunks(key: str, size: int) -> Callable[[Any, dict[str, Any]], None]:
    """``key``'s entry claims ``size`` elements in its first dimension; its chunks stay as they were."""

    def change(metadata: Any, meta: dict[str, Any]) -> None:
        entry = metadata.state_dict_metadata[key]
        entry.size = torch.Size([size, *entry.size[1:]])

    return change


def cancelling_chunks(metadata: Any, meta: dict[str, Any]) -> None:
    """The scheduler's blob claims 2^33 more bytes, and a chunk of -2^33 makes the sum come out right."""
    entry = metadata.state_dict_metadata["scheduler"]
    [chunk] = entry.chunks
    entry.size = torch.Size([entry.size[0] + 2**33])
    entry.chunks = [
        ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([entry.size[0]])),
        ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([-(2**33)])),
    ]


def negative_size(metadata: Any, meta: dict[str, Any]) -> None:
    metadata.state_dict_metadata["scheduler"].size = torch.Size([-5])


CRAFTS = {
    "a blob claiming 64 MiB": (lambda folder: blob_claims(BIG), "claims 67108864 bytes"),
    "a blob's size of 2^33 beyond its chunks": (lambda folder: size_beyond_chunks("scheduler", 2**33), "its chunks"),
    "a weight's size beyond its chunks": (lambda folder: size_beyond_chunks("model.weight", 2**31), "its chunks"),
    "chunk sizes that cancel out": (lambda folder: cancelling_chunks, "[-8589934592] are not all non-negative"),
    "a negative size": (lambda folder: negative_size, "size [-5] are not all non-negative"),
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


def reseal_metadata(folder: Path, data: bytes, *, digest: bool = True) -> None:
    """Replace the folder's ``.metadata`` with ``data`` and make meta.json's record match (with its digest)."""
    (folder / METADATA_FILE).write_bytes(data)
    meta = json.loads((folder / META_FILE).read_text())
    meta["files"][METADATA_FILE] = {"size": len(data)} | (
        {"sha256": hashlib.sha256(data).hexdigest()} if digest else {}
    )
    (folder / META_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("opcode", "digest", "said"),
    [
        (b"]", True, "more than the"),  # the red team's empty lists
        (b"}", True, "more than the"),  # empty dicts: the same category
        (b"]", False, "records no digest"),  # no digest: not read at all, whatever its size
    ],
)
def test_metadata_larger_than_the_loop_can_need_is_skipped_before_it_is_read(
    opcode: bytes,
    digest: bool,
    said: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    found = parts()
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=3, **found)
    ckpt.save(2)
    crafted = ckpt.save(4)
    budget = dcp_io.metadata_budget(["x"] * 20, 1)
    reseal_metadata(crafted, b"\x80\x04" + opcode * (budget + 1) + b".", digest=digest)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING):
            assert task.Checkpointer(tmp_path / "ckpt", **parts(seed=3)).load() == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"skipping damaged checkpoint {crafted}" in caplog.text and said in caplog.text
    assert peak < 24 << 20  # a load takes ~9 MiB; unpickled, the 1 MiB of opcodes would have cost ~70 MiB


def test_a_metadata_budget_grows_with_the_loops_state_and_its_writers() -> None:
    small, large = dcp_io.metadata_budget(["model.w"] * 10, 1), dcp_io.metadata_budget(["model.w"] * 10_000, 1)
    assert dcp_io.METADATA_BASE_BYTES < small < large < dcp_io.metadata_budget(["model.w"] * 10_000, 8)
    assert dcp_io.metadata_budget(["model.w"] * 10**6, 10**6) == dcp_io.MAX_METADATA_BYTES


def bomb_archive(pickle_bytes: int) -> bytes:
    """An archive laid out as torch.save writes one whose pickle is ``pickle_bytes`` of empty-dict opcodes."""
    saved = io.BytesIO()
    torch.save({"last_epoch": 1}, saved)
    crafted = io.BytesIO()
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(crafted, "w") as target:
        for record in source.infolist():
            data = source.read(record.filename)
            if record.filename.endswith("data.pkl"):
                data = b"\x80\x02" + b"}" * pickle_bytes + b"."
            target.writestr(record.filename, data)
    return crafted.getvalue()


def blob_holding(folder: Path, archive: bytes) -> Callable[[Any, dict[str, Any]], None]:
    """A change that makes the scheduler's blob ``archive`` (its stored record, entry and chunk to match)."""
    record = io.BytesIO()
    torch.save(torch.frombuffer(bytearray(archive), dtype=torch.uint8), record)
    stored = place(folder, "scheduler", record.getvalue())

    def change(metadata: Any, meta: dict[str, Any]) -> None:
        stored(metadata, meta)
        entry = metadata.state_dict_metadata["scheduler"]
        entry.size = entry.chunks[0].sizes = torch.Size([len(archive)])

    return change


def test_a_blob_whose_pickle_outgrows_the_live_parts_is_skipped_before_it_is_unpickled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dcp_io, "BLOB_PICKLE_FLOOR", 16 << 10)  # 2 MiB in the product: scaled down
    found = parts()
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=3, **found)
    ckpt.save(2)
    crafted = ckpt.save(4)
    live = len(bytes(dcp_io.to_blob(found["scheduler"].state_dict(), "scheduler").numpy()))
    rewrite(crafted, blob_holding(crafted, bomb_archive(dcp_io.blob_pickle_bound(live) + 1)))
    with caplog.at_level(logging.WARNING):
        assert task.Checkpointer(tmp_path / "ckpt", **parts(seed=3)).load() == 2
    assert (
        f"skipping damaged checkpoint {crafted}" in caplog.text and "more than it can legitimately need" in caplog.text
    )


def test_the_values_pickles_together_are_bounded_by_what_the_loop_can_need(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(dcp_io, "METADATA_BASE_BYTES", 64 << 10)  # 1 MiB in the product: scaled down
    found = parts()
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=3, **found)
    ckpt.save(2)
    crafted = ckpt.save(4)
    budget = dcp_io.metadata_budget(["x"] * 20, 1)
    rewrite(crafted, place(crafted, "model.bias", bomb_archive(budget)))  # one value's pickle, past the budget
    with caplog.at_level(logging.WARNING):
        assert task.Checkpointer(tmp_path / "ckpt", **parts(seed=3)).load() == 2
    assert f"skipping damaged checkpoint {crafted}" in caplog.text and "can need, together" in caplog.text


def test_listed_files_that_hold_nothing_do_not_make_the_metadata_budget_grow() -> None:
    empty = {f"__{rank}_0.distcp": {"size": 0} for rank in range(60_000)}
    assert saved_ranks({"world_size": 60_000, "files": {**empty, METADATA_FILE: {"size": 1 << 30}}}) == 1
    written = {f"__{rank}_0.distcp": {"size": MIN_RANK_FILE_BYTES} for rank in range(8)}
    assert saved_ranks({"world_size": 8, "files": {**empty, **written}}) == 8
    assert saved_ranks({"world_size": 2, "files": written}) == 2  # no more than it says wrote it
    assert saved_ranks({"world_size": "8", "files": written}) == 1


def test_a_directory_crowded_with_damaged_folders_ends_in_a_refusal_in_bounded_time(tmp_path: Path) -> None:
    ckpt = task.Checkpointer(tmp_path / "ckpt", keep_last=40, **parts())
    ckpt.save(1)
    for step in range(2, MAX_EXAMINED + 5):
        folder = ckpt.save(step)
        reseal_metadata(folder, (folder / METADATA_FILE).read_bytes(), digest=False)  # read by nothing
    started = time.process_time()  # CPU time: the machine's load is not the test's
    with pytest.raises(CheckpointError, match=f"the newest {MAX_EXAMINED} step folders .* the 4 older ones"):
        task.Checkpointer(tmp_path / "ckpt", **parts(seed=2)).load()
    assert time.process_time() - started < 60
