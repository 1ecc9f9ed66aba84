"""Reading a tensor DCP saved straight into the tensor that receives it: one read, no copy in between.

DCP stores each tensor as an archive ``torch.save`` wrote, and its reader
``torch.load``s that into a new tensor, then copies it into the loop's: two
passes over every byte and a new allocation, plus the archive's handling, for
each of a ResNet-50's 491 tensors (a load took 4.6x a plain ``torch.load``,
``benchmarks/task_checkpoint.py``). When the receiving tensor is a whole,
contiguous CPU tensor, :func:`read_into` reads the archive itself, under the
same rules: the archive checked first (``torch_archive.check_records``: stored
records only, the pickle bounded), its pickle read by torch's weights-only
unpickler with its one storage bound to the receiving tensor's memory (so the
pickle can describe nothing but a view of it), and accepted only when that view
is exactly the receiving tensor (type, shape, strides, offset); then the data
record, whose size must be the tensor's, is read into that memory. Anything
else (a slice of a value, a GPU tensor, another archive layout) is left to
DCP's own reader.
"""

from __future__ import annotations

import io
import struct
import sys
from typing import IO, Any

import torch
from torch import _weights_only_unpickler

from hpctrain.task.torch_archive import ArchiveError, Window, check_directory, read_directory

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # a zip record's local header: signature ... name length, extra length
_ENDS = 4096  # an archive's first and last bytes, read once: headers, its pickle, its directory (torch_archive.Window)
_EXPECTED = {
    *("data.pkl", "data/0", "byteorder", "version", ".data/version", ".data/serialization_id"),
    *(".format_version", ".storage_alignment"),
}


class _Elsewhere(Exception):
    """The archive describes something other than the receiving tensor: DCP's reader takes it."""


def read_into(
    stream: IO[bytes],
    offset: int,
    size: int,
    target: torch.Tensor,
    where: str,
    max_pickle: int,
    described: set[tuple[Any, ...]] | None = None,
) -> int | None:
    """Read the archive of ``size`` bytes at ``offset`` in ``stream`` into ``target``; the bytes of its pickle
    when it did, None when it is not a whole tensor this can read (DCP's reader must). :class:`ArchiveError`
    when the archive breaks the rules (``where`` names it). ``described``: a load's pickles already found to
    describe exactly a tensor of a type, shape and strides (a model's many tensors of one shape have the same
    pickle, unpickled once)."""
    nbytes = target.numel() * target.element_size()
    storage = target.untyped_storage() if target.device.type == "cpu" else None
    if storage is None or not target.is_contiguous() or target.storage_offset() or storage.nbytes() != nbytes:
        return None
    value = Window(stream, offset, size, ends=_ENDS)
    infos = read_directory(value, size, where)
    pickled = check_directory(infos, size, where, max_pickle=max_pickle).pickle
    records = {info.filename.split("/", 1)[-1]: info for info in infos}
    if not {"data.pkl", "data/0"} <= set(records) <= _EXPECTED or records["data/0"].file_size != nbytes:
        return None
    order = records.get("byteorder")
    if order is not None and (order.file_size > 16 or _record(value, order, size, where) != sys.byteorder.encode()):
        return None
    pickle = _record(value, records["data.pkl"], size, where)  # its size bounded by check_directory
    known = (pickle, target.dtype, tuple(target.shape), target.stride())
    if described is None or known not in described:
        if not _describes(pickle, target, storage):
            return None
        if described is not None:
            described.add(known)
    start = _data_start(value, records["data/0"].header_offset, where)
    if start + nbytes > size:
        raise ArchiveError(f"{where}: its tensor record reaches past the end of the value")
    stream.seek(offset + start)
    memory = memoryview(target.reshape(-1).view(torch.uint8).numpy()).cast("B")
    filled = 0
    while filled < nbytes:
        count = stream.readinto(memory[filled:])  # type: ignore[attr-defined]
        if not count:
            raise ArchiveError(f"{where}: its tensor record ends early ({filled} of {nbytes} bytes)")
        filled += count
    return pickled


def _describes(pickle: bytes, target: torch.Tensor, storage: torch.UntypedStorage) -> bool:
    """Whether ``pickle`` (weights-only) rebuilds exactly ``target``, its one storage bound to ``storage``."""

    def persistent_load(saved_id: tuple) -> torch.storage.TypedStorage:
        if not isinstance(saved_id, tuple) or len(saved_id) != 5:
            raise _Elsewhere
        kind, storage_type, key, location, numel = saved_id
        kind = kind.decode() if isinstance(kind, bytes) else kind
        location = location.decode() if isinstance(location, bytes) else location
        dtype = getattr(storage_type, "dtype", None)
        if (kind, key, location, dtype, numel) != ("storage", "0", "cpu", target.dtype, target.numel()):
            raise _Elsewhere
        return torch.storage.TypedStorage(wrap_storage=storage, dtype=target.dtype, _internal=True)

    unpickler = _weights_only_unpickler.Unpickler(io.BytesIO(pickle), encoding="utf-8")
    unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
    try:
        rebuilt = unpickler.load()
    except _Elsewhere:
        return False
    except Exception:  # noqa: BLE001 - anything the weights-only unpickler refuses: DCP's reader refuses it too
        return False
    return (
        type(rebuilt) is torch.Tensor
        and rebuilt.dtype == target.dtype
        and rebuilt.shape == target.shape
        and rebuilt.stride() == target.stride()
        and rebuilt.storage_offset() == 0
        and rebuilt.untyped_storage().data_ptr() == storage.data_ptr()
    )


def _record(value: IO[bytes], info: Any, size: int, where: str) -> bytes:
    """A stored record's bytes, read from where its local header says they begin (in the window's kept ends,
    for the small records: no ``zipfile`` stream per record)."""
    start = _data_start(value, info.header_offset, where)
    if start + info.file_size > size:
        raise ArchiveError(f"{where}: record {info.filename!r} reaches past the end of the value")
    value.seek(start)
    data = value.read(info.file_size)
    if len(data) != info.file_size:
        raise ArchiveError(f"{where}: record {info.filename!r} ends early")
    return data


def _data_start(value: IO[bytes], header_offset: int, where: str) -> int:
    """Where a stored record's bytes begin: after its local header, its name and its extra field (torch
    aligns the data with the extra field)."""
    value.seek(header_offset)
    header = value.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise ArchiveError(f"{where}: a record's header is cut short")
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    if signature != b"PK\x03\x04":
        raise ArchiveError(f"{where}: a record's header is not a zip local header")
    return header_offset + _LOCAL_HEADER.size + name_length + extra_length
