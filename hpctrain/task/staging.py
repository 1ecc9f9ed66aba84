"""An async save's copy of the state, into buffers kept from one save to the next, made by parallel copies.

An async save blocks the loop only while it copies the state to memory
(staging); the write then runs from the copy in the background
(``writing.py``). Two things make that copy cheap, as in the built-in trainer's
``trainer/snapshot.py``:

* **Kept buffers.** A fresh 200 MB is not a copy but an allocation whose every
  page faults in as it is written: on CPU it took the stall from the trainer's
  0.12-0.18 of a plain ``torch.save`` to 0.6 (``benchmarks/task_checkpoint.py``).
  :class:`Staging` keeps its buffers (pinned where CUDA is) and makes them anew
  only when the state's layout changed (an optimizer that created its state, a
  blob that grew): a copy into buffers of another layout would be wrong, not
  slow.
* **Parallel copies.** The host copies run as :data:`COPY_STREAMS`
  single-threaded streams on a kept pool (``Tensor.copy_`` lets go of the GIL):
  one stream is bound by one core's memory bandwidth, and torch's own
  multi-threaded copy spin-waits when other threads hold the cores (the trainer
  measured it 10-40x slower beside data-loader workers).

The copy is of DCP's flat state (``model.layer.weight``, ``optimizer.param_groups.0.lr``):
its tensors are the buffers, its plain values (a learning rate a scheduler
changed) the current ones. DTensor shards are copied through their local
tensors.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed._state_dict_utils import _create_cpu_state_dict
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.tensor import DTensor

COPY_STREAMS = 2


class Staging:
    """Kept copies of a state's tensors (see the module doc); :meth:`stage` before each async write."""

    def __init__(self) -> None:
        self._buffers: dict[str, Any] = {}
        self._layout: tuple[Any, ...] = ()
        self._pool: ThreadPoolExecutor | None = None

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        """A flat copy of ``state`` whose tensors are kept buffers. The previous save's write must have
        finished (the checkpointer waits for it first): the buffers are overwritten."""
        flat, _ = flatten_state_dict(state)
        layout = state_layout(flat)
        if layout != self._layout:
            tensors = {key: value for key, value in flat.items() if isinstance(value, torch.Tensor)}
            self._buffers = _create_cpu_state_dict(tensors, pin_memory=torch.cuda.is_available())
            self._layout = layout
        staged: dict[str, Any] = {}
        host: list[tuple[torch.Tensor, torch.Tensor]] = []
        device = False
        for key, value in flat.items():
            if not isinstance(value, torch.Tensor):
                staged[key] = value
                continue
            buffer = self._buffers[key]
            staged[key] = buffer
            if buffer is value:  # DCP's helper keeps a 0-d DTensor as it is: copy it whole
                staged[key] = value.detach().clone()
                continue
            target, source = (
                (buffer._local_tensor, value._local_tensor) if isinstance(value, DTensor) else (buffer, value)
            )
            if source.device.type == "cpu":
                host.append((target, source.detach()))
            else:
                target.copy_(source.detach(), non_blocking=True)
                device = True
        self._copy(host)
        if device:
            torch.cuda.synchronize()  # the device-to-host copies must land before the writer reads them
        return staged

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COPY_STREAMS, thread_name_prefix="checkpoint-staging")
        pairs = sorted(pairs, key=lambda pair: -pair[0].numel() * pair[0].element_size())
        shares = [pairs[i::COPY_STREAMS] for i in range(COPY_STREAMS)]  # largest first, dealt in turn: even
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for future in [self._pool.submit(_copy_all, share) for share in shares if share]:
                future.result()
        finally:
            torch.set_num_threads(threads)

    def close(self) -> None:
        """Let go of the buffers and the copying threads (a later :meth:`stage` makes them again)."""
        self._buffers, self._layout = {}, ()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)


def state_layout(flat: dict[str, Any]) -> tuple[Any, ...]:
    """What a staging buffer must match: each entry's key, and a tensor's type, shape, element type and device
    (a plain value's type only: it is not copied into a buffer)."""
    return tuple(
        (key, type(value), tuple(value.shape), value.dtype, value.device)
        if isinstance(value, torch.Tensor)
        else (key, type(value))
        for key, value in flat.items()
    )
