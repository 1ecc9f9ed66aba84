"""Copies of a training state that the loop can keep mutating: the blocking part of an async checkpoint.

A snapshot copies every tensor of a (nested) state into CPU staging buffers
kept from one save to the next, so the training loop waits only for a memory
copy; the file is written afterwards from the copy. Also the one definition
of what a checkpoint may contain (tensors, dicts, lists, tuples, numbers,
strings), so that it loads with ``weights_only=True``.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from hpctrain.errors import CheckpointError
from hpctrain.task.host_copy import HostCopies

SAFE_SCALARS = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def refuse_type(value: Any, path: tuple[Any, ...]) -> NoReturn:
    where = "state" + "".join(f"[{key!r}]" for key in path)
    raise CheckpointError(
        f"cannot checkpoint {where} of type {type(value).__name__}: only tensors, dicts, lists and numbers are saved",
        hint="convert it to a tensor, list or string before saving",
    )


class StagingBuffers:
    """Reusable CPU copies of a state's tensors: the first save allocates, later saves only copy.

    Freshly allocated memory costs a page fault per 4 KiB on first touch, which
    for a ResNet-50 state is slower than the copy itself; keeping the buffers
    makes every later snapshot a plain memory-bandwidth copy.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._copies = HostCopies("checkpoint-snapshot")

    def reserve(self, state: Any) -> None:
        self.snapshot(state)  # copying touches every page now, so the first real save does not fault them in

    def snapshot(self, state: Any) -> Any:
        """A copy of ``state`` whose tensors live in the staging buffers; unsafe types raise."""
        host_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        copied = self._walk(state, (), host_copies)
        self._copies.copy(host_copies)  # a few single-threaded streams (task/host_copy.py)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # the non_blocking device-to-host copies must land before the writer reads
        return copied

    def release(self) -> None:
        self._buffers.clear()
        self._copies.close()

    def _walk(self, value: Any, path: tuple[Any, ...], host_copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, path, host_copies)
        if isinstance(value, dict):
            return {k: self._walk(v, (*path, k), host_copies) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, (*path, i), host_copies) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return tuple(self._walk(v, (*path, i), host_copies) for i, v in enumerate(value))
        if isinstance(value, SAFE_SCALARS):
            return value
        refuse_type(value, path)

    def _tensor(
        self, tensor: torch.Tensor, path: tuple[Any, ...], host_copies: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        if tensor.layout != torch.strided or tensor.is_quantized:
            return tensor.detach().to("cpu", copy=True)
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda)
            self._buffers[path] = buffer
        if tensor.is_cuda:
            buffer.copy_(tensor.detach(), non_blocking=True)
        else:
            host_copies.append((buffer, tensor.detach()))
        return buffer
