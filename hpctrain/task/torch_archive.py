"""What an archive ``torch.save`` wrote may be before ``torch.load`` reads it: one rule for both checkpoint kinds.

``torch.load`` trusts the archive: a record compressed with deflate inflates to
whatever size its header claims (a 5 MB file, a 5 GiB tensor, allocated before
anything can object), and a pickle of any size is read whole. ``torch.save``
never compresses a record, so :func:`check_records` refuses any that is, from
the zip's directory alone. The built-in trainer's ``state.pt``
(``trainer/checkpoint_archive.py``) and every value of a task checkpoint
(``dcp_io.py``: each tensor record DCP wrote with ``torch.save``, each plain
blob) pass it before they are loaded.

A pickle costs memory far beyond its size as it is read (a byte of
empty-list opcodes makes a 56-byte list: an 8 MiB pickle took 514 MiB,
measured with tracemalloc), so its bound is the caller's, from what the
loop holds: ``max_pickle`` (:data:`MAX_PICKLE_BYTES` when it has no better).

The directory of an archive laid out as ``torch.save`` writes a small one is
read with ``struct`` (:func:`plain_directory`: a task checkpoint's 482 values
each have one, and ``zipfile`` took a third of a load's time parsing them);
anything else, ``zipfile`` reads. Either way the same rules judge what it says.
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections.abc import Sequence
from typing import IO, Any, NamedTuple

MAX_PICKLE_BYTES = 64 << 20  # a checkpoint's pickle is kilobytes to a few MB (RNG states of many ranks)


_END = struct.Struct("<4s4H2LH")  # the end of central directory record
_ENTRY = struct.Struct("<4s6H3L5H2L")  # a central directory entry, before its name, extra field and comment
_ZIP64_TAIL = 56 + 20  # torch writes a zip64 end record and its locator before the end record
_FULL = 0xFFFFFFFF  # a 32-bit field that says "see the zip64 extra field"


class ArchiveError(Exception):
    """An archive that ``torch.save`` did not write as it is (damaged or crafted)."""


class Records(NamedTuple):
    data: int  # bytes of the tensor records
    pickle: int  # bytes of the pickle


def check_records(source: IO[bytes], size: int, where: str, *, max_pickle: int | None = None) -> Records:
    """Raise :class:`ArchiveError` unless ``source`` (``size`` bytes, seekable) is an archive as ``torch.save``
    writes it: every record stored (not compressed) and inside it, the pickle at most ``max_pickle`` bytes
    (:data:`MAX_PICKLE_BYTES` when None). Reads only the zip's directory. ``where`` names it in errors."""
    return check_directory(read_directory(source, size, where), size, where, max_pickle=max_pickle)


def read_directory(source: IO[bytes], size: int, where: str) -> list[Any]:
    """The entries of the zip directory of ``source`` (``size`` bytes, seekable), judged by nobody yet:
    :func:`plain_directory` for torch's own small archives, ``zipfile`` for any other; raise
    :class:`ArchiveError` naming ``where`` when neither can read one."""
    try:
        records: list[Any] | None = plain_directory(source, size)  # torch's own small archives: no zipfile
        if records is None:
            with zipfile.ZipFile(source) as archive:
                records = list(archive.infolist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise ArchiveError(f"{where} is not an archive torch.save writes ({exc})") from exc
    return records


def check_directory(records: Sequence[Any], size: int, where: str, *, max_pickle: int | None = None) -> Records:
    """:func:`check_records` of an archive's directory already read (``zipfile``'s ``infolist()``, or
    :func:`plain_directory`'s entries), for a reader that goes on to read it: the directory is parsed once."""
    max_pickle = MAX_PICKLE_BYTES if max_pickle is None else max_pickle
    data = pickled = 0
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED or record.compress_size != record.file_size:
            raise ArchiveError(
                f"{where}: record {record.filename!r} is compressed ({record.compress_size} bytes that inflate "
                f"to {record.file_size}); torch.save stores every record as it is, so this file was crafted"
            )
        if record.header_offset + record.file_size > size:
            raise ArchiveError(f"{where}: record {record.filename!r} claims to reach past the end of the file")
        if record.filename.endswith("data.pkl"):
            if record.file_size > max_pickle:
                raise ArchiveError(
                    f"{where}: its pickle is {record.file_size} bytes, more than it can legitimately need "
                    f"({max_pickle} at most)"
                )
            pickled += record.file_size
        data += record.file_size if "/data/" in record.filename else 0
    return Records(data, pickled)


class Entry(NamedTuple):
    """A central directory entry, with the names ``zipfile.ZipInfo`` gives the same facts."""

    filename: str
    compress_type: int
    compress_size: int
    file_size: int
    header_offset: int


def plain_directory(source: IO[bytes], size: int) -> list[Entry] | None:
    """The central directory of an archive of ``size`` bytes laid out as ``torch.save`` writes a small one
    (the directory right before torch's zip64 end record or the end record, no comment, no zip64 fields),
    read with two ``struct`` calls per entry; None for anything else (``zipfile`` reads it then). Nothing is
    trusted: :func:`check_directory` judges the entries, and a reader bounds every read by ``size``."""
    if size < _END.size:
        return None
    source.seek(size - _END.size)
    end = source.read(_END.size)
    if len(end) != _END.size:
        return None
    signature, disk, cd_disk, on_disk, count, cd_size, cd_offset, comment = _END.unpack(end)
    directory_end = size - _END.size
    if signature != b"PK\x05\x06" or disk or cd_disk or on_disk != count or comment:
        return None
    if cd_offset + cd_size not in (directory_end, directory_end - _ZIP64_TAIL) or cd_size > directory_end:
        return None
    source.seek(cd_offset)
    directory = source.read(cd_size)
    entries, at = [], 0
    for _ in range(count):
        if at + _ENTRY.size > len(directory):
            return None
        fields = _ENTRY.unpack_from(directory, at)
        method, compressed, stored = fields[4], fields[8], fields[9]
        name_length, extra_length, comment_length, offset = fields[10], fields[11], fields[12], fields[16]
        name_end = at + _ENTRY.size + name_length
        if fields[0] != b"PK\x01\x02" or name_end > len(directory) or _FULL in (compressed, stored, offset):
            return None
        name = directory[at + _ENTRY.size : name_end].decode("utf-8", errors="replace")
        entries.append(Entry(name, method, compressed, stored, offset))
        at = name_end + extra_length + comment_length
    return entries if at == len(directory) else None


class Window(io.RawIOBase):
    """``length`` bytes of ``stream`` from ``offset`` on, as a seekable file of their own (one value of a DCP
    data file), so :func:`check_records` and ``zipfile`` see that value's archive and nothing past it.

    Its first and last ``ends`` bytes are read once each, when first asked for: a zip's directory, its
    records' headers and a tensor's pickle lie there, and ``zipfile`` reads them in many small pieces."""

    def __init__(self, stream: IO[bytes], offset: int, length: int, *, ends: int = 0) -> None:
        super().__init__()
        self._stream, self._offset, self._length, self._pos = stream, offset, length, 0
        self._ends = min(ends, length)
        self._head: bytes | None = None
        self._tail: bytes | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = max(0, min(len(buffer), self._length - self._pos))
        if not count:
            return 0
        data = self._from_ends(self._pos, count)
        if data is None:
            self._stream.seek(self._offset + self._pos)
            data = self._stream.read(count)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def _from_ends(self, start: int, count: int) -> bytes | None:
        """The ``count`` bytes at ``start`` from the kept ends, when they lie inside one of them."""
        if start + count <= self._ends:
            if self._head is None:
                self._head = self._read_at(0, self._ends)
            return self._head[start : start + count]
        tail_start = self._length - self._ends
        if self._ends and start >= tail_start:
            if self._tail is None:
                self._tail = self._read_at(tail_start, self._ends)
            return self._tail[start - tail_start : start - tail_start + count]
        return None

    def _read_at(self, start: int, count: int) -> bytes:
        self._stream.seek(self._offset + start)
        return self._stream.read(count)
