"""dcp_io: replicated state dealt over the ranks, metadata unpickled through an allowlist, plain blobs."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import pytest
import torch

from hpctrain.errors import CheckpointError
from hpctrain.task.dcp_io import (
    MetadataUnpickler,
    UnsafeCheckpoint,
    assign_replicated,
    from_blob,
    replicated_sizes,
    signature,
    to_blob,
)


def test_the_metadata_unpickler_builds_dcp_classes_and_nothing_else(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.metadata import Metadata, TensorProperties, TensorStorageMetadata

    entry = TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size([2, 3]), [])
    metadata = Metadata(state_dict_metadata={"model.w": entry})
    back = MetadataUnpickler(io.BytesIO(pickle.dumps(metadata))).load()
    assert back.state_dict_metadata["model.w"].size == torch.Size([2, 3])
    marker = tmp_path / "ran"
    for evil in (os.system, eval):

        class Evil:
            def __reduce__(self, fn: object = evil) -> tuple:
                return (fn, (f"open({str(marker)!r}, 'w')" if fn is eval else f"touch {marker}",))

        with pytest.raises(UnsafeCheckpoint, match="refers to"):
            MetadataUnpickler(io.BytesIO(pickle.dumps(Evil()))).load()
    assert not marker.exists()


def test_blobs_keep_plain_state_and_refuse_the_rest() -> None:
    state = {"lr": [0.1, 0.01], 3: (None, "x"), "t": torch.ones(2)}
    back = from_blob(to_blob(state, "sched"), "sched")
    assert back["lr"] == [0.1, 0.01] and back[3] == (None, "x") and torch.equal(back["t"], torch.ones(2))
    with pytest.raises(CheckpointError, match=r"sched\['fn'\] of type builtin_function_or_method"):
        to_blob({"fn": print}, "sched")
    evil = io.BytesIO()
    torch.save({"x": Path("/")}, evil)  # a pickle of an object weights_only does not allow
    with pytest.raises(UnsafeCheckpoint, match="refusing to load sched"):
        from_blob(torch.frombuffer(bytearray(evil.getvalue()), dtype=torch.uint8), "sched")


def test_replicated_entries_are_shared_among_the_writers_by_size() -> None:
    flat = {"m.a": torch.zeros(100), "m.b": torch.zeros(60), "m.c": torch.zeros(50), "lr": 0.1, "rng/rank-00003": 1}
    sizes = replicated_sizes(flat)
    assert sizes == {"m.a": 400, "m.b": 240, "m.c": 200, "lr": 1}  # a rank's own entry is not replicated
    assert assign_replicated(sizes, [2, 0]) == {"m.a": 2, "m.b": 0, "m.c": 0, "lr": 2}  # equals: the first listed
    # 2 nodes x 2 ranks, as SideGroup.writers lists them (each node's first rank, then each node's second): the
    # two largest go to the two nodes, and every rank writes a share
    four = {"m.a": 400, "m.b": 390, "m.c": 380, "m.d": 370}
    assert assign_replicated(four, [0, 2, 1, 3]) == {"m.a": 0, "m.b": 2, "m.c": 1, "m.d": 3}
    assert signature(sizes) == signature(dict(reversed(sizes.items())))
    assert signature(sizes) != signature({**sizes, "m.c": 201})
