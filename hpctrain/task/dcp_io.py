"""torch.distributed.checkpoint as the task API uses it: written once per node, read without pickle's trust.

DCP writes a folder: one ``__R_0.distcp`` file per writing rank and a
``.metadata`` that the coordinator (rank 0) writes last. What is changed here:

* **Loading never trusts a pickle.** DCP unpickles ``.metadata`` with plain
  ``pickle`` and the non-tensor values of a state (an optimizer's
  ``param_groups``) with ``torch.load(weights_only=False)``. :class:`SafeReader`
  unpickles the metadata through an allowlist of the classes DCP's metadata is
  made of (``MetadataUnpickler``); :class:`SafeLoadPlanner` loads values with
  ``weights_only=True``. Plain state the task API stores itself (a scheduler's,
  a sampler's, every rank's RNG) is one uint8 tensor made by ``torch.save``
  and read with ``weights_only=True`` (:func:`to_blob`, :func:`from_blob`).
* **Replicated state is written once, by one rank per node.** A value every
  rank holds alike (DDP's weights, a scheduler's state) is assigned to one of
  the nodes' first ranks (:func:`assign_replicated`, balanced by size), and
  only that rank hands it to DCP: the others neither copy it (an async save's
  staging) nor plan it. The writes spread over the nodes (each node's disk or
  network link carries its share), never all through rank 0. Should the ranks'
  replicated entries differ, every rank hands DCP everything and
  :class:`NodeWriterPlanner` dedups among the node writers. Sharded values
  (FSDP2's DTensors) are written by the rank that holds each shard.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem, SavePlan
from torch.distributed.tensor import DTensor

from hpctrain.errors import CheckpointError

METADATA_FILE = ".metadata"
MAX_METADATA_BYTES = 1 << 30  # DCP's metadata of the largest models is tens of megabytes

_ALLOWED_CLASSES = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}
_SAFE_LEAVES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


class UnsafeCheckpoint(CheckpointError):
    """A checkpoint file that holds objects hpctrain does not unpickle."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata`` and nothing else: any other class is refused before it is built."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = name in _ALLOWED_CLASSES.get(module, ())
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True  # torch.float32, torch.uint8, ...
        if not allowed:
            raise UnsafeCheckpoint(
                f"refusing to load a checkpoint whose {METADATA_FILE} refers to {module}.{name}",
                hint="hpctrain never unpickles arbitrary objects; this folder was not written by hpctrain.task",
            )
        return super().find_class(module, name)


def load_metadata(path: Path) -> Metadata:
    """A step folder's ``.metadata`` (the file itself), through :class:`MetadataUnpickler`; bounded read."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_METADATA_BYTES + 1)
    if len(data) > MAX_METADATA_BYTES:
        raise CheckpointError(f"{path} is larger than {MAX_METADATA_BYTES >> 20} MiB; not read")
    metadata = MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{path} does not hold checkpoint metadata (found {type(metadata).__name__})")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file-system reader, with :func:`load_metadata` instead of ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
        metadata = load_metadata(Path(self.path) / name)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class NodeWriterPlanner(DefaultSavePlanner):
    """DCP's save planner; a value several ranks hold goes to one of ``writers`` (each node's first rank)."""

    def __init__(self, writers: Collection[int] = ()) -> None:
        super().__init__()
        self.writers = frozenset(writers)

    def _dedup_save_plans(self, all_plans: list[SavePlan]) -> list[SavePlan]:
        return dedup_save_plans(prefer_writers(all_plans, self.writers), save_to_lowest_rank=False)


def prefer_writers(plans: list[SavePlan], writers: Collection[int]) -> list[SavePlan]:
    """``plans`` (one per rank) without the replicated items of ranks outside ``writers`` where a writer has them."""
    holders: dict[Any, set[int]] = defaultdict(set)
    for rank, plan in enumerate(plans):
        for item in plan.items:
            holders[item.index].add(rank)
    drop: dict[int, set[Any]] = defaultdict(set)
    for index, ranks in holders.items():
        if len(ranks) > 1 and ranks & set(writers):
            for rank in ranks - set(writers):
                drop[rank].add(index)
    return [
        dataclasses.replace(plan, items=[item for item in plan.items if item.index not in drop[rank]])
        if drop[rank]
        else plan
        for rank, plan in enumerate(plans)
    ]


def replicated_sizes(flat: Mapping[str, Any]) -> dict[str, int]:
    """The entries of a flat state every rank holds alike -- not a shard (DTensor), not a rank's own
    (``name/rank-N``) -- and their sizes in bytes (1 for a non-tensor value)."""
    return {
        key: value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 1
        for key, value in flat.items()
        if not isinstance(value, DTensor) and "/rank-" not in key
    }


def signature(sizes: Mapping[str, int]) -> int:
    """A number that differs when two ranks' replicated entries (names or sizes) differ."""
    return zlib.crc32("\n".join(f"{key}:{size}" for key, size in sorted(sizes.items())).encode())


def assign_replicated(sizes: Mapping[str, int], writers: Collection[int]) -> dict[str, int]:
    """Each replicated entry -> the writer that saves it: largest first, to the writer with the least so far.

    A pure function of the entries and the writers, so every rank computes the same answer alone; each
    rank then hands DCP only its own share (the others' copies are neither staged nor planned).
    """
    load = {writer: 0 for writer in sorted(writers)}
    owner = {}
    for key, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        writer = min(load, key=lambda w: (load[w], w))
        owner[key] = writer
        load[writer] += size
    return owner


def data_file_sizes(metadata: Metadata) -> dict[str, int]:
    """Each data file of a saved folder -> its size (its last item's end), from DCP's own record."""
    sizes: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        sizes[info.relative_path] = max(sizes.get(info.relative_path, 0), end)
    return sizes


def flat_keys(state: Mapping[str, Any]) -> dict[str, Any]:
    """DCP's flat keys of a (nested) state: ``model.layer.weight``, ``optimizer.param_groups.0.lr``."""
    flat, _ = flatten_state_dict(dict(state))
    return flat


def stored_shape(metadata: Metadata, key: str) -> torch.Size | None:
    """The saved (global) shape of tensor ``key``, or None when the entry is not a tensor."""
    entry = metadata.state_dict_metadata.get(key)
    return entry.size if isinstance(entry, TensorStorageMetadata) else None


# -- plain state as one tensor -----------------------------------------------------------------------------------
def to_blob(state: Any, what: str) -> torch.Tensor:
    """``state`` (tensors, dicts, lists, numbers, strings) as a uint8 tensor that loads with ``weights_only``."""
    check_plain(state, (what,))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def from_blob(blob: torch.Tensor, what: str) -> Any:
    try:
        return torch.load(io.BytesIO(blob.cpu().numpy().tobytes()), weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(
            f"refusing to load {what}: it holds objects other than tensors, dicts, lists and numbers",
            hint="hpctrain never unpickles arbitrary objects",
        ) from exc


def check_plain(value: Any, path: tuple[Any, ...]) -> None:
    """Refuse at save time what ``weights_only`` loading would refuse at resume time (named by its path)."""
    if isinstance(value, (dict, OrderedDict)):
        for key, item in value.items():
            check_plain(key, path)
            check_plain(item, (*path, key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain(item, (*path, index))
    elif isinstance(value, DTensor):
        raise CheckpointError(
            f"cannot checkpoint {_where(path)}: a sharded tensor (DTensor) in plain state",
            hint="register the sharded model or optimizer itself (model=..., optimizer=...) so it is saved sharded",
        )
    elif not isinstance(value, (torch.Tensor, *_SAFE_LEAVES)):
        raise CheckpointError(
            f"cannot checkpoint {_where(path)} of type {type(value).__name__}: a state_dict() may hold tensors, "
            "dicts, lists, tuples, numbers and strings",
            hint="convert it (a NumPy array to a tensor, an object to a dict of numbers) in that state_dict()",
        )


def _where(path: tuple[Any, ...]) -> str:
    return str(path[0]) + "".join(f"[{key!r}]" for key in path[1:])
