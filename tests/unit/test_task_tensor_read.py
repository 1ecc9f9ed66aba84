"""A tensor value read straight into the receiving tensor, only when its archive describes exactly that tensor."""

from __future__ import annotations

import io

import pytest
import torch

from hpctrain.task.tensor_read import read_into
from hpctrain.task.torch_archive import ArchiveError


def archive(value: torch.Tensor, prefix: bytes = b"") -> io.BytesIO:
    """``value`` as torch.save writes it, after ``prefix`` (a DCP data file holds many values one after another)."""
    buffer = io.BytesIO()
    buffer.write(prefix)
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_a_whole_tensor_is_read_into_the_receiving_one(dtype: torch.dtype) -> None:
    saved = (torch.randn(5, 7) * 100).to(dtype)
    stream = archive(saved, prefix=b"x" * 100)
    target = torch.zeros(5, 7, dtype=dtype)
    before = target.data_ptr()
    assert read_into(stream, 100, len(stream.getbuffer()) - 100, target, "v", 1 << 20)
    assert torch.equal(target, saved) and target.data_ptr() == before  # in place: no new tensor


@pytest.mark.parametrize(
    ("saved", "target"),
    [
        (torch.randn(5, 7), torch.zeros(7, 5)),  # another shape
        (torch.randn(5, 7), torch.zeros(5, 7, dtype=torch.float64)),  # another type
        (torch.randn(5, 7).t(), torch.zeros(7, 5)),  # the same shape, other strides
        (torch.randn(10)[2:7], torch.zeros(5)),  # a view of a larger storage
        (torch.randn(5, 7), torch.zeros(5, 14)[:, :7]),  # a receiving tensor that is not contiguous
    ],
)
def test_anything_but_exactly_the_receiving_tensor_is_left_to_dcps_reader(
    saved: torch.Tensor, target: torch.Tensor
) -> None:
    stream = archive(saved)
    untouched = target.clone()
    assert read_into(stream, 0, len(stream.getbuffer()), target, "v", 1 << 20) is None
    assert torch.equal(target, untouched)


def test_a_crafted_archive_is_refused_before_anything_is_read() -> None:
    stream = archive(torch.randn(64))
    data = bytearray(stream.getvalue())
    with pytest.raises(ArchiveError, match="pickle"):
        read_into(io.BytesIO(bytes(data)), 0, len(data), torch.zeros(64), "v", max_pickle=8)  # over its bound
    with pytest.raises(ArchiveError, match="not an archive"):
        read_into(io.BytesIO(bytes(data[: len(data) // 2])), 0, len(data) // 2, torch.zeros(64), "v", 1 << 20)


def test_a_pickle_found_to_describe_one_tensor_is_trusted_for_that_tensor_only() -> None:
    described: set[tuple[object, ...]] = set()
    saved = torch.randn(5, 7)
    stream = archive(saved)
    first = torch.zeros(5, 7)
    assert read_into(stream, 0, len(stream.getbuffer()), first, "v", 1 << 20, described)
    assert len(described) == 1 and torch.equal(first, saved)
    second = torch.zeros(5, 7)  # a tensor of the same shape: its archive's pickle is the one already judged
    assert read_into(archive(saved * 2), 0, len(stream.getbuffer()), second, "v", 1 << 20, described)
    assert torch.equal(second, saved * 2) and len(described) == 1
    for other in (torch.zeros(5, 7, dtype=torch.float64), torch.zeros(7, 5)):  # judged anew, and refused
        assert read_into(archive(saved), 0, len(stream.getbuffer()), other, "v", 1 << 20, described) is None
        assert not other.any()
