"""Stop requests: signal handlers only set a flag; ranks agree at step boundaries.

A time-limit warning (USR1/USR2) or a preemption/cancel SIGTERM must never
interrupt a step or a checkpoint write half-way. Handlers record *why* we
should stop; the training loop calls :meth:`StopRequest.agreed` at each step
boundary, which (when a process group is up) runs one small all-reduce so
every rank stops at the same step.

Slurm sends the same SIGTERM for a preemption, a plain ``scancel`` and a
job that ran past its limit. ``hpctrain cancel`` tells them apart for us: it
writes a cancel marker into the run directory *before* it calls ``scancel``.
A SIGTERM while a marker naming this job exists means "cancelled" (never
requeue); any other SIGTERM means "preempted". The marker is read outside the
handler, when the loop asks for the reason.

The marker itself (where it lies, what it says) is the contract's:
:mod:`hpctrain.contract.cancel_marker`. Nothing here imports torch at module level.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal

from hpctrain.contract.cancel_marker import marker_applies
from hpctrain.runtime import heartbeat

StopReason = Literal["timeout", "preempted", "cancelled"]

# Higher wins when ranks disagree: a cancel beats a preemption beats a timeout,
# because a cancelled job must not requeue itself.
_REASON_CODES: dict[str, int] = {"timeout": 1, "preempted": 2, "cancelled": 3}
_CODE_REASONS = {code: reason for reason, code in _REASON_CODES.items()}


class StopRequest:
    """A signal-safe 'please stop soon' flag with a reason.

    ``cancel_markers`` and ``job_ids`` turn a SIGTERM into "cancelled" when
    ``hpctrain cancel`` left a marker naming this job (see the module docstring).
    """

    def __init__(self, cancel_markers: Sequence[Path] = (), job_ids: Collection[str] = ()) -> None:
        self._code = 0
        self.cancel_markers = tuple(Path(p) for p in cancel_markers)
        self.job_ids = tuple(str(j) for j in job_ids)
        # Signals seen so far, by kind; the exit protocol (requeue.py) waits for
        # "one more SIGTERM" to know that Slurm is ending the job.
        self.timeout_signals = 0
        self.term_signals = 0
        self.handlers: dict[int, Any] = {}  # what install_handlers installed, checked by agreed()
        self._replaced: set[int] = set()

    def request(self, reason: StopReason) -> None:
        # No lock: this runs in signal handlers (main thread, between bytecodes).
        self._code = max(self._code, _REASON_CODES[reason])

    def note_term(self) -> None:
        """Handler for SIGTERM: count it and ask to stop as 'preempted' (maybe 'cancelled' later)."""
        self.term_signals += 1
        self.request("preempted")

    def note_timeout(self) -> None:
        """Handler for the time-limit warning signal."""
        self.timeout_signals += 1
        self.request("timeout")

    def cancel_requested(self) -> bool:
        """Whether a cancel marker for this job exists (reads files; never call from a handler)."""
        return any(marker_applies(path, self.job_ids) for path in self.cancel_markers)

    def _refresh(self) -> int:
        # A SIGTERM becomes a cancel once the marker is visible. Checked every
        # call until then: on NFS a new file may take a few seconds to show.
        if self._code == _REASON_CODES["preempted"] and self.cancel_requested():
            self.request("cancelled")
        return self._code

    @property
    def local_reason(self) -> StopReason | None:
        """This rank's own reason, without talking to the others."""
        return _CODE_REASONS.get(self._refresh())  # type: ignore[return-value]

    def agreed(self) -> StopReason | None:
        """The reason every rank agrees on, or None. Collective when distributed.

        Every rank must call it at the same step boundaries.
        """
        self.check_handlers()
        code = all_reduce_max(self._refresh())
        self._code = max(self._code, code)
        return _CODE_REASONS.get(code)  # type: ignore[return-value]

    def check_handlers(self) -> None:
        """Say once per signal, on stderr, that code run after the launcher replaced its handler.

        An entry point (or a library it calls) that installs its own SIGTERM handler takes the stop away
        from this run: preemption, the time limit and ``hpctrain cancel`` would then end it without a stop
        checkpoint and without a requeue, which nothing said until the job was gone.
        """
        for signum, ours in self.handlers.items():
            current = signal.getsignal(signum)
            if current is ours or signum in self._replaced:
                continue
            self._replaced.add(signum)
            name = signal.Signals(signum).name
            print(
                f"hpctrain: {name}'s handler was replaced after the launcher installed its own "
                f"({describe_handler(current)}): this run no longer hears {name} (preemption, the time limit, "
                "hpctrain cancel) and cannot stop at a step boundary or requeue. Remove that handler (the "
                "loop's ctx.stop.agreed() says when to stop), or call the handler signal.signal() returned "
                "from yours",
                file=sys.stderr,
                flush=True,
            )


def describe_handler(handler: Any) -> str:
    """``module.function`` of a signal handler, for a message; never raises."""
    if handler is None:
        return "installed outside Python"
    if handler in (signal.SIG_DFL, signal.SIG_IGN):
        return signal.Handlers(handler).name
    module = getattr(handler, "__module__", None) or "?"
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    return f"{module}.{name}"


def all_reduce_max(code: int) -> int:
    """The largest ``code`` over all ranks; ``code`` itself without a process group.

    Collective when distributed: every rank must call it.
    """
    import torch.distributed as dist  # only ever called on compute nodes

    if not (dist.is_available() and dist.is_initialized()):
        return code
    import torch

    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([code], dtype=torch.int32, device=device)
    with heartbeat.phase("allreduce"):
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def install_handlers(stop: StopRequest, timeout_signal: str = "USR2") -> dict[int, object]:
    """Route the time-limit signal and SIGTERM to ``stop``; return the old handlers.

    Replaces submitit's own handlers on purpose: submitit checkpoints and
    requeues inside the signal handler (mid-step, rank 0 only) and ignores
    SIGTERM, which is the only signal a Slurm 22.05 preemption sends. Must run
    in the main thread.
    """
    timeout_signum = getattr(signal, f"SIG{timeout_signal}")

    def on_timeout(signum: int, frame: object) -> None:
        stop.note_timeout()

    def on_term(signum: int, frame: object) -> None:
        stop.note_term()

    previous = {}
    for signum, handler in ((timeout_signum, on_timeout), (signal.SIGTERM, on_term)):
        previous[signum] = signal.signal(signum, handler)
        stop.handlers[signum] = handler
    return previous


def restore_handlers(previous: dict[int, object]) -> None:
    """Put back what :func:`install_handlers` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
