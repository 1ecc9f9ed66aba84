"""What a ``state.pt`` may be before torch reads it, and what its tensors would take. Torch-light.

``torch.load`` trusts the archive: a record compressed with deflate inflates to
whatever size its header claims (a 5 MB file, a 5 GiB tensor, allocated before
anything can object), and a pickle of any size is read whole. :func:`check_archive`
applies the rule both checkpoint kinds share (``hpctrain/task/torch_archive.py``:
every record stored, inside the file, the pickle bounded) to a ``state.pt``, from
the zip's directory alone. :func:`tensor_bytes` sums what a ``meta`` load's
storages would take once loaded for real, so a caller can bound it first.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import torch

from hpctrain.task.torch_archive import MAX_PICKLE_BYTES, ArchiveError, check_records

__all__ = ["MAX_PICKLE_BYTES", "ArchiveError", "check_archive", "tensor_bytes"]


def check_archive(state_path: Path) -> int:
    """Raise :class:`ArchiveError` unless ``state_path`` is an archive as ``torch.save`` writes it (see
    ``task/torch_archive.check_records``); reads only the zip's directory; returns the bytes of the tensor records."""
    try:
        size = state_path.stat().st_size
        with open(state_path, "rb") as handle:
            return check_records(handle, size, str(state_path)).data
    except OSError as exc:
        raise ArchiveError(f"{state_path} is not an archive torch.save writes ({exc})") from exc


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
