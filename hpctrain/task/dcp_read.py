"""Reading a task checkpoint folder into the loop's state: whole tensors straight from the files, the rest by DCP.

What may be read, and how much, is ``dcp_io.py``'s (the metadata unpickled
through an allowlist, every value's place checked by ``check_storage``, the
pickles bounded by ``metadata_budget``); this module does the reading.

:func:`load_into` fills a state the loop holds. Each tensor that is a whole,
contiguous CPU tensor and that the folder stores as one chunk of the same
shape is read by :class:`SafeReader` itself, straight into the loop's memory
(``tensor_read.py``: its archive checked, its pickle bounded and unpickled
weights-only, accepted only when it describes exactly that tensor). That is
a ResNet-50's 482 tensors and every blob of plain state, with none of DCP's
per-value planning (its planner spent more time on a load than the reading).
What is left -- a slice of a value (another number of ranks), a DTensor
shard, a GPU tensor, a plain value such as a learning rate -- goes through
``dcp.load`` with the same reader (each value's archive checked before
``torch.load`` reads it, weights-only: :class:`SafeLoadPlanner`).
"""

from __future__ import annotations

import dataclasses
import io
from collections import defaultdict
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.tensor import DTensor

from hpctrain.task.dcp_io import MAX_METADATA_BYTES, METADATA_FILE, UnsafeCheckpoint, load_metadata
from hpctrain.task.tensor_read import read_into
from hpctrain.task.torch_archive import ArchiveError, check_records


def load_into(state: dict[str, Any], reader: SafeReader) -> None:
    """Fill ``state`` (the loop's, nested as DCP's state helpers give it) from ``reader``'s folder, in place
    where a tensor is read whole; plain values are replaced. This rank alone: no plan exchange (``no_dist``)."""
    flat, mappings = flatten_state_dict(state)
    with reader:
        rest = {key: value for key, value in flat.items() if not reader.read_whole(key, value)}
        if rest:
            dcp.load(rest, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    for key, value in rest.items():
        set_element(state, mappings[key], value)


class SafeReader(FileSystemReader):
    """DCP's file-system reader, with :func:`load_metadata` instead of ``pickle.load``, and each value's
    archive checked (``torch_archive.check_records``) before it is read; the values' pickles, together, at
    most ``pickle_budget`` bytes (``dcp_io.metadata_budget``). Use it for one load, then :meth:`close` it."""

    def __init__(
        self, path: str | Path, *, pickle_budget: int = MAX_METADATA_BYTES, metadata: Metadata | None = None
    ) -> None:
        super().__init__(path)
        self.metadata_max = self.pickle_left = pickle_budget
        self.metadata = metadata  # already read (and checked) by the caller: not unpickled twice
        self._described: set[tuple[Any, ...]] = set()  # pickles found to describe a tensor (tensor_read.py)
        self._folder = str(path)
        self._streams: dict[str, IO[bytes]] = {}
        self._places: dict[str, list[Any]] | None = None

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()

    def __enter__(self) -> SafeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
        if rank is None and self.metadata is not None:
            metadata = self.metadata
        else:
            metadata = load_metadata(Path(self.path) / name, self.metadata_max)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_whole(self, key: str, target: Any) -> bool:
        """Read flat entry ``key`` into ``target`` when it is a whole CPU tensor the folder stores as one
        chunk of its shape; whether it did (False: DCP's reader must)."""
        if not isinstance(target, torch.Tensor) or isinstance(target, DTensor) or target.device.type != "cpu":
            return False
        entry = self._metadata().state_dict_metadata.get(key)
        if not isinstance(entry, TensorStorageMetadata) or len(entry.chunks) != 1:
            return False
        chunk = entry.chunks[0]
        shape = list(target.shape)
        if list(entry.size) != shape or list(chunk.sizes) != shape or any(chunk.offsets):
            return False
        places = self._stored(key)
        if len(places) != 1:
            return False
        return self._read_into(self._stream(places[0].relative_path), places[0], target)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> torch.futures.Future[None]:
        """Each whole CPU tensor read straight into the loop's (``tensor_read.py``); the rest by DCP's reader."""
        rest = []
        for item in plan.items:
            sinfo = self.storage_data[item.storage_index]
            if not self._read_whole_item(sinfo, item, planner):
                rest.append(item)
        if rest:
            return super().read_data(dataclasses.replace(plan, items=rest), planner)
        done: torch.futures.Future[None] = torch.futures.Future()
        done.set_result(None)
        return done

    def _read_whole_item(self, sinfo: Any, item: ReadItem, planner: LoadPlanner) -> bool:
        if item.type != LoadItemType.TENSOR or sinfo.transform_descriptors or any(item.storage_offsets):
            return False
        target = planner.resolve_tensor(item).detach()
        if list(item.lengths) != list(target.shape):
            return False
        if not self._read_into(self._stream(sinfo.relative_path), sinfo, target):
            return False
        planner.commit_tensor(item, target)
        return True

    def _read_into(self, stream: IO[bytes], sinfo: Any, target: torch.Tensor) -> bool:
        if sinfo.transform_descriptors:  # check_storage refused them already
            return False
        where = f"{self._folder}/{sinfo.relative_path} at {sinfo.offset}"  # no Path per value: 482 of them
        try:
            pickled = read_into(stream, sinfo.offset, sinfo.length, target, where, self.pickle_left, self._described)
        except ArchiveError as exc:
            raise UnsafeCheckpoint(f"{exc} (what this loop's values can need, together)") from exc
        if pickled is None:
            return False
        self.pickle_left -= pickled
        return True

    def _metadata(self) -> Metadata:
        if self.metadata is None:
            self.metadata = load_metadata(Path(self.path) / METADATA_FILE, self.metadata_max)
        return self.metadata

    def _stored(self, key: str) -> list[Any]:
        """Where the folder stores flat entry ``key``: its storage records (``check_storage`` checked each)."""
        if self._places is None:
            self._places = defaultdict(list)
            for index, info in (self._metadata().storage_data or {}).items():
                self._places[index.fqn].append(info)
        return self._places.get(key, [])

    def _stream(self, relative_path: str) -> IO[bytes]:
        """One open file per data file for the whole load (its name is one of meta.json's: check_storage)."""
        if relative_path not in self._streams:
            self._streams[relative_path] = open(Path(self.path) / relative_path, "rb")  # noqa: SIM115 - close()
        return self._streams[relative_path]

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        """The value's archive, read whole in one call (``check_storage`` held its length against the file's
        size): ``torch.load`` then reads memory, not the file through many small reads of a view of it."""
        if sinfo.transform_descriptors:  # check_storage refused them already; DCP would decode (decompress) them
            raise UnsafeCheckpoint(f"{self.path}: a value stored through {list(sinfo.transform_descriptors)}")
        where = f"{Path(self.path) / sinfo.relative_path} at {sinfo.offset}"
        file.seek(sinfo.offset)
        value = io.BytesIO(file.read(sinfo.length))
        try:
            found = check_records(value, len(value.getbuffer()), where, max_pickle=self.pickle_left)
        except ArchiveError as exc:
            raise UnsafeCheckpoint(f"{exc} (what this loop's values can need, together)") from exc
        self.pickle_left -= found.pickle
        value.seek(0)
        return value


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, loading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
