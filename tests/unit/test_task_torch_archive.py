"""An archive's directory as torch.save writes it, read without zipfile, and the rules every archive must meet."""

from __future__ import annotations

import io
import struct
import zipfile

import pytest
import torch

from hpctrain.task.torch_archive import ArchiveError, check_directory, plain_directory


def saved(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "value",
    [torch.randn(5, 7), torch.tensor(3), torch.zeros(0), torch.arange(300_000), {"lr": 0.1, "w": torch.ones(2)}],
)
def test_the_plain_directory_is_zipfiles_for_what_torch_save_writes(value: object) -> None:
    data = saved(value)
    fast = plain_directory(io.BytesIO(data), len(data))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        slow = [
            (i.filename, i.compress_type, i.compress_size, i.file_size, i.header_offset) for i in archive.infolist()
        ]
    assert fast is not None and [tuple(entry) for entry in fast] == slow


def test_anything_else_is_left_to_zipfile_and_a_deflated_record_is_refused_either_way() -> None:
    data = saved(torch.randn(64))
    assert plain_directory(io.BytesIO(data[:-1]), len(data) - 1) is None  # cut short: no end record there
    assert plain_directory(io.BytesIO(data + b"comment"), len(data) + 7) is None
    lying = bytearray(data)
    struct.pack_into("<H", lying, len(lying) - 12, 99)  # the end record claims 99 entries
    assert plain_directory(io.BytesIO(bytes(lying)), len(lying)) is None

    crafted = io.BytesIO()
    with zipfile.ZipFile(crafted, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data/0", bytes(1 << 20))
    entries = plain_directory(crafted, len(crafted.getbuffer()))
    assert entries is not None and entries[0].file_size == 1 << 20 and entries[0].compress_size < 2000
    with pytest.raises(ArchiveError, match="is compressed"):
        check_directory(entries, len(crafted.getbuffer()), "v")
