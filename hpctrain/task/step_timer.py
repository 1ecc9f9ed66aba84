"""Each rank laps a clock through its steps; once per log window the ranks combine their sums.

The built-in trainer laps :class:`StepClock` itself; your own loop uses
:class:`StepTimer` (``hpctrain.task.StepTimer``), the same clock with a
``log`` that writes the window's ``step_split`` record (docs/scaling.md)::

    timer = task.StepTimer(model)            # after task.ddp(model): watches its all-reduce
    for step, (x, y) in enumerate(loader):
        timer.lap("data")
        x, y = x.to(device), y.to(device)
        timer.lap("h2d")
        loss = loss_fn(model(x), y)
        timer.lap("forward")
        loss.backward()
        timer.backward_done()                # backward compute | exposed communication
        optimizer.step()
        timer.lap("optimizer")
        timer.step_done()
        if (step + 1) % 20 == 0:
            task.log(step + 1, loss=loss.item())
            timer.log(step + 1)              # collective: every rank, at the same steps

``lap(part)`` gives the time since the previous lap to ``part`` (one of
``contract/step_split.MEASURED``), so a rank's parts add up to its wall time.
On the CPU the clock is ``perf_counter``; on a GPU each lap records a CUDA
event on the current stream (no synchronisation) and the window's events are
read once, at the window's end, where the log line waits for the device anyway.

DDP's forward begins with a collective: with ``broadcast_buffers`` (on by
default) rank 0's buffers (BatchNorm's running statistics) are broadcast
before the module's own forward runs, so a rank whose batch came early waits
there for the ranks whose batch came late. Two forward pre-hooks (one on the
DDP wrapper, one on the module inside it) lap that stretch into ``sync``, the
step's waits in collectives, not into ``forward``: the step split counts it
as straggler wait where a slower rank's own work explains it. It costs two
clock reads (on a GPU: two events) per forward; DDP itself is untouched.

DDP's all-reduce runs inside the backward. A comm hook (DDP's default
all-reduce, wrapped) notes when the last gradient bucket is handed over: the
backward's compute ends there, and what follows until the backward returns is
communication the backward did not hide (``comm``). A model whose strategy
registered its own comm hook is left alone (its backward is all ``backward``).

Where the hook is on, each step's own compute (``contract/step_split.OWN``:
copy, forward, backward up to the last bucket's hand-over, optimizer; no
wait for a peer in it) also goes to the heartbeat (``compute_kind: step``),
which slow-node eviction compares (``healing/eviction.py``): a rank slow in
any of them is seen, a rank that only waits for a slow peer is not. On a
GPU a step's events are read once they have completed (``query``, a step or
so later), never synchronising the stream.

:meth:`StepClock.window` is collective (one all-gather of a few numbers per rank).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hpctrain.contract.step_split import MEASURED, OWN, split_record
from hpctrain.runtime import heartbeat

INDEX = {part: i for i, part in enumerate(MEASURED)}
OWN_PARTS = frozenset(INDEX[part] for part in OWN)


class StepClock:
    """One rank's lapped sums over the current window (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.sums = [0.0] * len(MEASURED)
        self.steps = 0
        self._grads_handed: Any = None  # when the last bucket was handed to the all-reduce (time or event)
        self._events: list[tuple[int, Any]] = []
        self.feeds_heartbeat = False  # set by watch_ddp: the step's own compute is split from its waits
        self._own = 0.0  # this step's own compute so far (CPU)
        self._own_events: list[tuple[Any, Any]] = []  # this step's own intervals (GPU: start and end events)
        self._pending: list[list[tuple[Any, Any]]] = []  # GPU: steps done whose events may not have completed
        self.restart()

    def restart(self) -> None:
        """Begin a new window now."""
        self.sums = [0.0] * len(MEASURED)
        self.steps = 0
        self._events = []
        if self.cuda:
            self._last: Any = self._event()
            self._window_start: Any = self._last
        else:
            self._last = self._window_start = time.perf_counter()
        self._previous: Any = self._last  # the last lap's end (GPU: its event)

    def _event(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def lap(self, part: str) -> None:
        """The time since the last lap was spent in ``part``."""
        self._until(INDEX[part], self._event() if self.cuda else time.perf_counter())

    def _until(self, index: int, end: Any) -> None:
        """The time from the last lap to ``end`` (a time, or an event on a GPU) was spent in part ``index``."""
        if self.cuda:
            self._events.append((index, end))
            if index in OWN_PARTS:
                self._own_events.append((self._previous, end))
        else:
            self.sums[index] += end - self._last
            if index in OWN_PARTS:
                self._own += end - self._last
            self._last = end
        self._previous = end

    def backward_done(self) -> None:
        """The backward returned: split it at the last bucket's hand-over into compute and exposed comm."""
        handed, self._grads_handed = self._grads_handed, None
        if handed is not None:
            self._until(INDEX["backward"], handed)
            self.lap("comm")
        else:
            self.lap("backward")

    def step_done(self) -> None:
        """A step ended; its own compute goes to the heartbeat where the DDP hook splits it from the waits."""
        self.steps += 1
        if not self.feeds_heartbeat:
            self._own, self._own_events = 0.0, []
        elif self.cuda:
            if self._own_events:
                self._pending.append(self._own_events)
            self._own_events = []
            self._harvest()
        else:
            heartbeat.recorder().compute(self._own, kind="step")
            self._own = 0.0

    def _harvest(self) -> None:
        """The GPU steps whose events have completed, oldest first, into the heartbeat (never waits)."""
        while self._pending and self._pending[0][-1][1].query():
            intervals = self._pending.pop(0)
            seconds = sum(max(0.0, start.elapsed_time(end)) for start, end in intervals) / 1000
            heartbeat.recorder().compute(seconds, kind="step")
        del self._pending[:-8]  # never more than a few steps in flight

    def watch_ddp(self, model: nn.Module) -> bool:
        """Time a DDP model's buffer sync and register the comm hook; whether the comm hook was registered
        (never on a model with a hook of its own)."""
        if not isinstance(model, nn.parallel.DistributedDataParallel):
            return False
        self.watch_buffer_sync(model)
        if getattr(model, "_comm_hooks", None):
            return False
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        group = model.process_group

        def hook(state: Any, bucket: Any) -> Any:
            self._grads_handed = self._event() if self.cuda else time.perf_counter()
            return allreduce_hook(group, bucket)

        # DDP checks the annotations themselves; this module's are strings (``from __future__ import annotations``)
        hook.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        model.register_comm_hook(None, hook)
        self.feeds_heartbeat = True
        return True

    def watch_buffer_sync(self, model: nn.Module) -> None:
        """Lap DDP's work before its module's forward (the buffer broadcast, a collective) into ``sync``.

        ``model``: DDP, or any wrapper whose forward calls its ``model.module``. At the wrapper's entry the
        time since the last lap goes to ``forward`` (where it went without the hooks); at the module's own
        forward, the time since the entry goes to ``sync``. Forwards without gradients (validation: no
        train step's time) are not lapped, nor the module called on its own, nor a forward that
        ``torch.compile`` traces (a clock read in its graph would be a constant).
        """
        entered = False

        def enter(module: nn.Module, args: Any) -> None:
            nonlocal entered
            if torch.is_grad_enabled() and not torch.compiler.is_compiling():  # a compiled graph: not split
                self.lap("forward")
                entered = True

        def inner(module: nn.Module, args: Any) -> None:
            nonlocal entered
            if entered:
                entered = False
                self.lap("sync")

        model.register_forward_pre_hook(enter)
        model.module.register_forward_pre_hook(inner, prepend=True)  # the module's own pre-hooks are its forward

    def _seconds(self) -> tuple[list[float], float]:
        """This window's sums and wall time in seconds (on a GPU: reads the events, after they completed)."""
        if not self.cuda:
            return list(self.sums), time.perf_counter() - self._window_start
        sums = [0.0] * len(MEASURED)
        if not self._events:
            return sums, 0.0
        self._events[-1][1].synchronize()  # the window's last event: every earlier one has completed too
        previous = self._window_start
        for index, event in self._events:
            sums[index] += max(0.0, previous.elapsed_time(event) / 1000)
            previous = event
        return sums, self._window_start.elapsed_time(previous) / 1000

    def window(self, *, global_step: int, epoch: int) -> dict[str, Any] | None:
        """Every rank's window combined into a step_split record (every rank gets it); :meth:`restart` follows.

        Collective when distributed: every rank calls it at the same step.
        """
        if self.steps == 0:
            return None
        sums, wall = self._seconds()
        rows = [[*sums, wall, float(self.steps)]]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
            mine = torch.tensor(rows[0], dtype=torch.float64, device=device)
            every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(every, mine)
            rows = [t.tolist() for t in every]
        steps = int(min(row[-1] for row in rows))
        rank_sums = [dict(zip(MEASURED, row[: len(MEASURED)])) for row in rows]
        return split_record(
            rank_sums, [row[len(MEASURED)] for row in rows], steps, global_step=global_step, epoch=epoch
        )


class NoClock:
    """A clock that measures nothing (hogwild's workers, parameter servers): every call is a no-op."""

    steps = 0

    def lap(self, part: str) -> None:
        pass

    def backward_done(self) -> None:
        pass


class StepTimer(StepClock):
    """A :class:`StepClock` for your own loop: ``log(step)`` writes the window into metrics.jsonl (rank 0).

    ``model``: a DDP model whose all-reduce to watch (the comm hook is registered now, before its first
    forward); ``device``: the one the loop computes on (default: ``task.context().device``).
    """

    def __init__(self, model: nn.Module | None = None, device: torch.device | None = None) -> None:
        from hpctrain.task.session import session

        super().__init__(device or session().info.device)
        if model is not None:
            self.watch_ddp(model)

    def log(self, step: int, *, epoch: int = 0) -> dict[str, Any] | None:
        """End the window at optimizer step ``step``: every rank's split, written by rank 0; a new window begins.

        Collective when distributed (every rank calls it at the same steps); returns the record (every rank).
        """
        from hpctrain.task.reporting import append_record

        self.lap("other")
        record = self.window(global_step=step, epoch=epoch)
        self.restart()  # every rank's next window starts as the gather ends; rank 0's write is in it as log
        if record is not None:
            append_record(record)
            self.lap("log")
        return record
