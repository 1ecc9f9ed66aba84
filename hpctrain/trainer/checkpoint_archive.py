"""What a ``state.pt`` may be before torch reads it, and what its tensors would take. Torch-light.

``torch.load`` trusts the archive: a record compressed with deflate inflates to
whatever size its header claims (a 5 MB file, a 5 GiB tensor, allocated before
anything can object), and a pickle of any size is read whole. ``torch.save``
never compresses a record, so :func:`check_archive` refuses any that is, from
the zip's directory alone. :func:`tensor_bytes` sums what a ``meta`` load's
storages would take once loaded for real, so a caller can bound it first.
"""

from __future__ import annotations

import zipfile
from collections import deque
from pathlib import Path
from typing import Any

import torch

MAX_PICKLE_BYTES = 64 << 20  # a trainer checkpoint's pickle is kilobytes to a few MB (RNG states of many ranks)


class ArchiveError(Exception):
    """A ``state.pt`` that ``torch.save`` did not write as it is (damaged or crafted)."""


def check_archive(state_path: Path) -> int:
    """Raise unless ``state_path`` is an archive as ``torch.save`` writes it: every record stored (not
    compressed: a deflated record inflates to whatever its header says) and inside the file, the pickle at
    most :data:`MAX_PICKLE_BYTES`. Reads only the zip's directory; returns the bytes of the tensor records."""
    try:
        size = state_path.stat().st_size
        with zipfile.ZipFile(state_path) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise ArchiveError(f"{state_path} is not an archive torch.save writes ({exc})") from exc
    data = 0
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            raise ArchiveError(
                f"{state_path}: record {record.filename!r} is compressed ({record.compress_size} bytes that inflate "
                f"to {record.file_size}); torch.save stores every record as it is, so this file was crafted"
            )
        if record.header_offset + record.file_size > size:
            raise ArchiveError(f"{state_path}: record {record.filename!r} claims to reach past the end of the file")
        if record.filename.endswith("data.pkl") and record.file_size > MAX_PICKLE_BYTES:
            raise ArchiveError(
                f"{state_path}: its pickle is {record.file_size} bytes, more than a checkpoint's "
                f"({MAX_PICKLE_BYTES} at most)"
            )
        data += record.file_size if "/data/" in record.filename else 0
    return data


def tensor_bytes(state: Any) -> tuple[int, tuple[str, int]]:
    """(bytes every storage of ``state``'s tensors take or would take, (the largest tensor's key, its bytes)),
    each storage counted once: of a ``meta`` load, whose storages know their size and their record's offset,
    or of live tensors."""
    seen: dict[object, int] = {}
    largest = ("", 0)
    queue: deque[tuple[str, Any]] = deque([("state", state)])
    while queue:
        name, value = queue.popleft()
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            key = _storage_key(storage, value)
            if key not in seen:
                seen[key] = int(storage.nbytes())
                largest = max(largest, (name, seen[key]), key=lambda item: item[1])
        elif isinstance(value, dict):
            queue.extend((f"{name}[{key!r}]", item) for key, item in value.items())
        elif isinstance(value, (list, tuple)):
            queue.extend((f"{name}[{index}]", item) for index, item in enumerate(value))
    return sum(seen.values()), largest


def _storage_key(storage: torch.UntypedStorage, tensor: torch.Tensor) -> object:
    """What tells storages apart: a meta load's record offset, else a live storage's address."""
    offset = getattr(storage, "_checkpoint_offset", None)
    if offset is not None:
        return ("record", offset)
    address = storage.data_ptr()
    return (str(storage.device), address) if address else ("tensor", id(tensor))
