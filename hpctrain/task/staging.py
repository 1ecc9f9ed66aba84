"""An async save's copy of the state, into buffers kept from one save to the next.

``dcp.async_save`` blocks the loop while it copies the state to memory (staging),
then writes in the background. DCP's own writer makes that copy into new tensors
on every save unless told to cache them, and caches only into pinned memory (a
CUDA machine's). A fresh 200 MB is not a copy but an allocation whose every page
faults in as it is written: on CPU it took the stall from the trainer's 0.12-0.18
of a plain ``torch.save`` to 0.6 (``benchmarks/task_checkpoint.py``). So
:class:`StagingWriter` keeps its buffers (pinned where CUDA is) as the built-in
trainer does (``trainer/checkpoint.py``'s ``reserve``), and makes them anew only
when the state's layout changed (an optimizer that created its state, a blob
that grew): a copy into buffers of another layout would be wrong, not slow.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._nested_dict import flatten_state_dict


class StagingWriter(FileSystemWriter):
    """DCP's file-system writer whose staging copies into kept buffers (see the module doc)."""

    def __init__(self, path: Any) -> None:
        super().__init__(path, sync_files=True)
        self._buffers: dict[str, Any] | None = None
        self._layout: tuple[Any, ...] = ()

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state_dict`` in memory the next save reuses (the previous save's write has finished:
        the checkpointer waits for it first)."""
        layout = state_layout(state_dict)
        if self._buffers is None or layout != self._layout:
            self._buffers = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self._layout = layout
        return _copy_state_dict(state_dict, self._buffers, type_check=False)


def state_layout(state: dict[str, Any]) -> tuple[Any, ...]:
    """What a staging buffer must match: each entry's key, and a tensor's shape, type and device (a plain
    value's type: it is not copied into a buffer)."""
    flat, _ = flatten_state_dict(state)
    return tuple(
        (key, tuple(value.shape), value.dtype, value.device, type(value))
        if isinstance(value, torch.Tensor)
        else (key, type(value))
        for key, value in flat.items()
    )
