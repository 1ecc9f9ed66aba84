"""torch.distributed.checkpoint as the task API uses it: written once per node, read without pickle's trust.

DCP writes a folder: one ``__R_0.distcp`` file per writing rank and a
``.metadata`` that the coordinator (rank 0) writes last. What is changed here:

* **Loading never trusts a pickle.** DCP unpickles ``.metadata`` with plain
  ``pickle`` and the non-tensor values of a state (an optimizer's
  ``param_groups``) with ``torch.load(weights_only=False)``. The metadata is
  unpickled here through an allowlist of the classes DCP's metadata is made of
  (:class:`MetadataUnpickler`, :func:`load_metadata`); values load with
  ``weights_only=True`` (``dcp_read.py``). Plain state the task API stores itself (a scheduler's,
  a sampler's, every rank's RNG) is one uint8 tensor made by ``torch.save``
  and read with ``weights_only=True`` (:func:`to_blob`, :func:`from_blob`).
* **Loading allocates nothing the folder does not hold.** Before a load,
  :func:`check_storage` holds DCP's record of where each value lies against
  the files ``meta.json`` lists (a plain name, inside the file, no decoding
  transform) and each tensor's bytes against the bytes stored for it; each
  value read is an archive ``torch.save`` wrote as it is (``torch_archive.py``:
  nothing compressed that would inflate, the pickle bounded), checked from its
  zip directory just before it is read (``dcp_read.SafeReader``), and so is
  each blob before it is unpickled. A whole CPU tensor is read straight into
  the loop's (``tensor_read.py``: its pickle must describe exactly that
  tensor); anything else through DCP's reader. Each rank reads alone, without
  DCP's plan exchange (the checkpointer has the ranks agree on the outcome).
* **Loading is bounded by what the loop holds.** A pickle costs memory far
  beyond its bytes as it is read (``torch_archive.py``), so each is bounded
  before it is read by what this loop's state can legitimately need:
  ``.metadata`` and the pickles of all values DCP reads, together, by
  :func:`metadata_budget` (DCP writes ~230 bytes per value and writing rank;
  four times that and the value's name, above 1 MiB); each blob's pickle by
  :func:`blob_pickle_bound` (16 times the live part's, at least 2 MiB). Every
  size that decides an allocation -- a tensor entry's size, each chunk's
  offsets and sizes -- is a non-negative int, the chunks fill the entry's
  size exactly, and their bytes are stored (:func:`check_storage`); a tensor
  is allocated at the shape the loop holds (``checkpoint_check.check_fits``).
* **Replicated state is written once, its entries dealt out over every rank.**
  A value every rank holds alike (DDP's weights, a scheduler's state) is
  assigned to one rank (:func:`assign_replicated`, balanced by size, each
  node's first rank dealt to before any node's second), and only that rank
  hands it to DCP: the others neither copy it (an async save's staging) nor
  plan it. The copies and writes spread over the nodes (each node's disk or
  network link carries its share) and over a node's ranks (each copies a
  part: an async save's stall on 4 ranks of one node was rank 0 copying all
  of it), never all through rank 0. Should the ranks'
  replicated entries differ, every rank hands DCP everything and
  :class:`LookupPlanner` (DCP's own dedup) spreads them over the ranks. Sharded values
  (FSDP2's DTensors) are written by the rank that holds each shard.
"""

from __future__ import annotations

import io
import os
import pickle
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.tensor import DTensor

from hpctrain.contract.runfiles import RunFileError, open_regular
from hpctrain.errors import CheckpointError
from hpctrain.task.torch_archive import ArchiveError, check_records

METADATA_FILE = ".metadata"
MAX_METADATA_BYTES = 1 << 30  # DCP's metadata of the largest models is tens of megabytes
METADATA_BASE_BYTES = 1 << 20
METADATA_BYTES_PER_VALUE = 1024  # DCP writes ~230 per value and chunk (1.8 MB for 8,013 values): 4x, plus the name
BLOB_PICKLE_GROWTH = 16  # a plain part's pickle may be this many times what the live part's is ...
BLOB_PICKLE_FLOOR = 2 << 20  # ... and at least this many bytes

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


def metadata_budget(keys: Collection[str], ranks: int) -> int:
    """The most bytes the ``.metadata`` of a loop whose state has ``keys`` (DCP's flat keys), saved by
    ``ranks`` writing ranks, can legitimately hold; and the most its values' pickles, read together, may."""
    per_rank = sum(METADATA_BYTES_PER_VALUE + 4 * len(key) for key in keys)
    return min(MAX_METADATA_BYTES, METADATA_BASE_BYTES + max(1, ranks) * per_rank)


def blob_pickle_bound(live_bytes: int) -> int:
    """The most bytes a plain part's pickle may have in a checkpoint, when the live part's blob has ``live_bytes``."""
    return max(BLOB_PICKLE_FLOOR, BLOB_PICKLE_GROWTH * live_bytes)


def load_metadata(path: Path, max_bytes: int = MAX_METADATA_BYTES) -> Metadata:
    """A step folder's ``.metadata`` (a regular file of at most ``max_bytes``), through :class:`MetadataUnpickler`."""
    try:
        with open_regular(path) as handle:  # read(n) would allocate n bytes at once: never more than the file has
            data = handle.read(min(max_bytes, os.fstat(handle.fileno()).st_size) + 1)
    except RunFileError as exc:
        raise UnsafeCheckpoint(exc.message) from exc
    if len(data) > max_bytes:
        raise UnsafeCheckpoint(f"{path} is larger than {max_bytes} bytes; not read")
    metadata = MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{path} does not hold checkpoint metadata (found {type(metadata).__name__})")
    return metadata


class LookupPlanner(DefaultSavePlanner):
    """DCP's save planner (its dedup of values several ranks hold spreads them over the ranks, as
    :func:`assign_replicated` does), with a quicker lookup of a whole plain tensor."""

    def lookup_object(self, index: MetadataIndex) -> Any:
        """A whole plain tensor as DCP's lookup finds it, without its type checks per value (a runtime
        protocol check costs tens of microseconds, and a ResNet-50 has 482 tensors)."""
        found = self.state_dict.get(index.fqn)
        if type(found) is torch.Tensor and (index.offset is None or not any(index.offset)):
            return found
        return super().lookup_object(index)


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


def assign_replicated(sizes: Mapping[str, int], writers: Sequence[int]) -> dict[str, int]:
    """Each replicated entry -> the writer that saves it: largest first, to the writer with the least so far
    (of equals, the one listed first: ``SideGroup.writers`` lists each node's first rank before any second).

    A pure function of the entries and the writers, so every rank computes the same answer alone; each
    rank then hands DCP only its own share (the others' copies are neither staged nor planned).
    """
    order = {writer: position for position, writer in enumerate(writers)}
    load = dict.fromkeys(order, 0)
    owner = {}
    for key, size in sorted(sizes.items(), key=lambda item: (-item[1], item[0])):
        writer = min(load, key=lambda w: (load[w], order[w]))
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


def by_part(flat: Mapping[str, Any]) -> dict[str, Any]:
    """DCP's flat state grouped under each part's name (``model.layer.weight`` as ``{"model": {"layer.weight":
    ...}}``): DCP flattens it to the same keys, and its save wraps each top-level entry in a logged call (two log
    records and the group's facts each: ~30 ms for a ResNet-50's 492 flat keys)."""
    grouped: dict[str, Any] = {}
    for key, value in flat.items():
        part, dot, rest = key.partition(".")
        if dot:
            grouped.setdefault(part, {})[rest] = value
        else:
            grouped[key] = value
    return grouped


def check_storage(metadata: Metadata, files: Mapping[str, Any]) -> None:
    """Raise :class:`UnsafeCheckpoint` unless every value DCP's ``metadata`` places lies inside a data file of
    ``files`` (meta.json's, sizes checked on disk), stored without a decoding transform, and every tensor entry
    is one a load can allocate: its size and each chunk's offsets and sizes non-negative ints, the chunks
    inside the size and filling it exactly, their bytes at most the bytes stored for the entry."""
    stored: dict[str, int] = defaultdict(int)
    for index, info in (metadata.storage_data or {}).items():
        name, offset, length = (getattr(info, key, None) for key in ("relative_path", "offset", "length"))
        entry = files.get(name) if isinstance(name, str) and name != METADATA_FILE else None
        if not isinstance(index, MetadataIndex) or not isinstance(entry, Mapping) or not isinstance(index.fqn, str):
            raise UnsafeCheckpoint(f"a value is placed in {name!r}, which is not one of the folder's data files")
        if not all(type(v) is int and v >= 0 for v in (offset, length)) or offset + length > entry.get("size", -1):
            raise UnsafeCheckpoint(f"a value of {index.fqn!r} is placed outside {name!r} ({offset}+{length} bytes)")
        if getattr(info, "transform_descriptors", None):
            raise UnsafeCheckpoint(f"{index.fqn!r} is stored through {info.transform_descriptors!r}; not decoded")
        stored[index.fqn] += length
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            claimed = _entry_bytes(key, entry)
            if claimed > stored.get(key, 0):
                raise UnsafeCheckpoint(
                    f"{key!r} claims {claimed} bytes, but {stored.get(key, 0)} are stored for it: not allocated"
                )


def _entry_bytes(key: str, entry: TensorStorageMetadata) -> int:
    """The bytes a tensor entry's chunks hold, once its size and chunks are checked (see check_storage)."""
    dtype = getattr(getattr(entry, "properties", None), "dtype", None)
    if not isinstance(dtype, torch.dtype):
        raise UnsafeCheckpoint(f"{key!r} has no tensor type ({dtype!r})")
    shape = _sizes(key, "size", entry.size)
    covered = 0
    for chunk in entry.chunks if isinstance(entry.chunks, list) else ():
        offsets, sizes = _sizes(key, "chunk offsets", chunk.offsets), _sizes(key, "chunk sizes", chunk.sizes)
        if (
            len(offsets) != len(shape)
            or len(sizes) != len(shape)
            or any(start + length > limit for start, length, limit in zip(offsets, sizes, shape))
        ):
            raise UnsafeCheckpoint(f"a chunk of {key!r} ({list(offsets)}+{list(sizes)}) lies outside its size {shape}")
        covered += _numel(sizes)
    if covered != _numel(shape):
        raise UnsafeCheckpoint(f"{key!r} claims size {shape} ({_numel(shape)} elements), its chunks hold {covered}")
    return covered * torch.empty((), dtype=dtype).element_size()


def _sizes(key: str, what: str, value: Any) -> list[int]:
    """``value`` as a list of non-negative ints (a torch.Size, a tuple), or UnsafeCheckpoint naming ``key``."""
    if not isinstance(value, (tuple, list)) or not all(type(v) is int and v >= 0 for v in value):
        shown = list(value) if isinstance(value, (tuple, list)) else repr(value)
        raise UnsafeCheckpoint(f"{key!r}: its {what} {shown} are not all non-negative whole numbers")
    return list(value)


def _numel(sizes: list[int]) -> int:
    count = 1
    for size in sizes:
        count *= size
    return count


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
    try:  # what a load would refuse, refused now: a pickle over the bound (plain lists of millions of numbers)
        check_records(buffer, len(buffer.getbuffer()), f"the state of {what}")
    except ArchiveError as exc:
        raise CheckpointError(
            f"cannot checkpoint {exc}", hint="keep large state in tensors (a list of numbers as torch.tensor(...))"
        ) from exc
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def from_blob(blob: torch.Tensor, what: str, max_pickle: int = BLOB_PICKLE_FLOOR) -> Any:
    """The plain state of blob ``what``: its archive checked first (its pickle at most ``max_pickle`` bytes:
    :func:`blob_pickle_bound`), then ``torch.load(weights_only=True)``."""
    data = io.BytesIO(blob.cpu().numpy().tobytes())
    try:
        check_records(data, len(data.getbuffer()), what, max_pickle=max_pickle)
        data.seek(0)
        return torch.load(data, weights_only=True)
    except ArchiveError as exc:
        raise UnsafeCheckpoint(str(exc), hint="hpctrain never unpickles arbitrary objects") from exc
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(
            f"refusing to load {what}: it holds objects other than tensors, dicts, lists and numbers",
            hint="hpctrain never unpickles arbitrary objects",
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a damaged archive: torch raises RuntimeError, ValueError, ...
        raise UnsafeCheckpoint(f"{what} cannot be read: {exc}") from exc


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
