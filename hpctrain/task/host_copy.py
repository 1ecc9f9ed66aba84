"""Host-to-host tensor copies as a few single-threaded streams on a kept pool: the blocking part of an async save.

Both the task API's checkpointer (``task/writing.py``) and the built-in trainer's
(``trainer/snapshot.py``) copy a state into kept buffers before writing it in the
background. One stream is bound by one core's memory bandwidth, and torch's own
multi-threaded copy spin-waits when other threads hold the cores (measured 10-40x
slower beside data-loader workers), so the copies run as :data:`COPY_STREAMS`
single-threaded streams (``Tensor.copy_`` lets go of the GIL), the largest tensors
dealt first so the streams end together.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

COPY_STREAMS = 2

Pairs = list[tuple[torch.Tensor, torch.Tensor]]  # (target, source)


class HostCopies:
    """Copies ``(target, source)`` pairs of CPU tensors on threads kept from one save to the next."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None

    def copy(self, pairs: Pairs) -> None:
        """Copy every pair; returns when all are done."""
        if not pairs:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(COPY_STREAMS, thread_name_prefix=self._name)
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
        """Let go of the threads (a later :meth:`copy` starts them again)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _copy_all(pairs: Pairs) -> None:
    with torch.no_grad():
        for target, source in pairs:
            target.copy_(source)
