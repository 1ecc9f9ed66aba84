"""Each rank times the forward of its own module, for slow-node eviction (``healing/eviction.py``).

The fallback where the step clock cannot split the backward from the
gradients' communication (no DDP comm hook: single, dp, a strategy with a
hook of its own); with DDP the clock feeds eviction each step's whole own
compute instead (``task/step_timer.py``), which also sees a slow backward.

In synchronous data-parallel training every rank's step takes as long as the
slowest one's; the forward of the plain module inside DDP's wrapper is the
rank's own work (DDP broadcasts buffers *before* it calls the module), so its
time tells a slow node from the ones that wait for it. Two hooks on the
module record it into the heartbeat (``runtime/heartbeat.py``): on the CPU
with the clock, on a GPU with CUDA events read one forward later, when they
have completed (``query``), so the training stream is never synchronised.
Validation (``module.training`` false) is not timed, nor DataParallel's
replicas (they run in threads of their own).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
from torch import nn

from hpctrain.runtime import heartbeat


class ForwardTimer:
    """Forward hooks on ``module`` that feed :meth:`hpctrain.runtime.heartbeat.Recorder.compute`."""

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        self.module, self.cuda = module, device.type == "cuda"
        self._started = 0.0
        self._events: tuple[Any, Any] | None = None
        self._pending: list[tuple[Any, Any]] = []
        self.handles = [module.register_forward_pre_hook(self._before), module.register_forward_hook(self._after)]

    def _before(self, module: nn.Module, args: Any) -> None:
        if not module.training or threading.current_thread() is not threading.main_thread():
            return  # validation; or DataParallel's replicas, which run in threads of their own: not timed
        if self.cuda:
            self._harvest()
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._events = (start, torch.cuda.Event(enable_timing=True))
        else:
            self._started = time.perf_counter()

    def _after(self, module: nn.Module, args: Any, output: Any) -> None:
        if not module.training or threading.current_thread() is not threading.main_thread():
            return
        if not self.cuda:
            heartbeat.recorder().compute(time.perf_counter() - self._started)
        elif self._events is not None:
            self._events[1].record()
            self._pending.append(self._events)
            self._events = None

    def _harvest(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end = self._pending.pop(0)
            heartbeat.recorder().compute(start.elapsed_time(end) / 1000)
        del self._pending[:-8]  # never more than a few forwards in flight

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
