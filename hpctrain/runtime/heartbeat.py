"""Each rank's heartbeat: what it is doing now (cheap to record) and a thread that writes it down.

Recording is a few attribute writes on the process-wide :class:`Recorder` --
no I/O, no lock, no host-device sync -- so the training loop can call it
several times per step::

    from hpctrain.runtime import heartbeat

    with heartbeat.phase("allreduce"):
        dist.all_reduce(tensor)
    heartbeat.step(n)          # optimizer step n is done (arms the hang watchdog)
    heartbeat.beat()           # progress without a new step (one validation batch)

:class:`Monitor` is one daemon thread per rank, started by the launcher for the
trainer and for custom entry points alike. Every ``poll_s`` it asks the hang
watchdog (``hpctrain.runtime.hang``) whether the rank stopped making progress
and, every ``distributed.heartbeat_interval_s`` and at once after a milestone
(the first step of an attempt, a new epoch, entering or leaving a checkpoint,
validation or the end), writes ``heartbeats/rank-NNNNN.json`` (the fields of
:class:`hpctrain.contract.heartbeat_files.Heartbeat`) atomically into the run directory,
which is shared by all nodes. It never
creates the run directory (a path that does not exist on this node is not the
shared one) and never raises: an error is logged once and the thread goes on.
Torch-free.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.contract.metrics import append_metrics
from hpctrain.contract.rundir import heartbeat_path, write_json_atomic
from hpctrain.contract.starts import record_first_step

log = logging.getLogger(__name__)

RECENT_STEPS = 20  # step times kept for the median
POLL_S = 1.0  # how often the thread looks at the recorder (hang checks; writes when due)
# Phases whose start and end are milestones: the file is rewritten at once, so that what it says
# before a rank freezes (SIGSTOP, a dead node) is at most one poll old at these points, not an interval.
MILESTONE_PHASES = frozenset({"checkpoint", "validation", "done"})


class Recorder:
    """Where this process is: step, phase, and when each last changed. Written by the training thread only."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        now = clock()
        self.step_no = 0
        self.epoch: int | None = None
        self.phase_name = "setup"
        self.phase_since = now
        self.last_progress = now
        self.changes = 0  # bumped on every step, phase change and beat: the watchdog compares it
        self.armed = False  # set by the first completed step: warm-up is not a hang
        self.step_times: deque[float] = deque(maxlen=RECENT_STEPS)
        self.compute_times: deque[float] = deque(maxlen=RECENT_STEPS)
        self.compute_count = 0
        self.compute_kind: str | None = None  # what compute_times measure (contract/heartbeat_files.COMPUTE_KINDS)
        self.first_step: tuple[int, float] | None = None  # (number, when) of the first step done here
        self._last_step_at: float | None = None

    def set_phase(self, name: str) -> str:
        """Enter phase ``name``; returns the phase it left."""
        previous = self.phase_name
        if name != previous:
            self.phase_name, self.phase_since = name, self.clock()
            self.changes += 1
        return previous

    def step(self, number: int, epoch: int | None = None) -> None:
        """Step ``number`` is done: records its time and arms the watchdog."""
        now = self.clock()
        if epoch is not None:
            self.epoch = epoch
        if number == self.step_no:
            return
        if self._last_step_at is not None:
            self.step_times.append(now - self._last_step_at)
        self._last_step_at, self.step_no, self.last_progress = now, number, now
        if self.first_step is None:
            self.first_step = (number, now)
        self.changes += 1
        self.armed = True

    def compute(self, seconds: float, kind: str = "forward") -> None:
        """The rank's own work took ``seconds`` (no waits: slow-node eviction compares it). ``kind``: one
        step's own compute (``step``, ``task/step_timer.py``) or one forward of its module (``forward``)."""
        self.compute_times.append(seconds)
        self.compute_count += 1
        self.compute_kind = kind

    def position(self, number: int, epoch: int | None = None) -> None:
        """Start counting at step ``number`` (a resume) without calling it progress."""
        self.step_no, self.epoch, self._last_step_at = number, epoch, None

    def beat(self) -> None:
        """Progress that is not a step (a validation batch, a hogwild worker's report): it moves
        ``last_progress`` too, so that the hang report can tell a rank whose validation went on from one
        that never had a batch (both wait in the same phase at the same step)."""
        self.last_progress = self.clock()
        self.changes += 1

    def milestone(self) -> tuple[bool, int | None, str]:
        """What changes rarely and matters to a reader: armed, epoch, and a milestone phase or ``train``."""
        phase = self.phase_name if self.phase_name in MILESTONE_PHASES else "train"
        return (self.armed, self.epoch, phase)

    def snapshot(self) -> dict[str, Any]:
        """The heartbeat fields this recorder knows (read from another thread; copies first)."""
        try:
            times = list(self.step_times)
        except RuntimeError:  # appended to while copied
            times = []
        try:
            computes = list(self.compute_times)
        except RuntimeError:
            computes = []
        return {
            "epoch": self.epoch,
            "step": self.step_no,
            "phase": self.phase_name,
            "phase_since": self.phase_since,
            "last_progress": self.last_progress,
            "recent_step_times_s": [round(t, 4) for t in times],
            "step_time_median_s": round(statistics.median(times), 4) if times else None,
            "recent_compute_times_s": [round(t, 5) for t in computes],
            "compute_time_median_s": round(statistics.median(computes), 5) if computes else None,
            "compute_count": self.compute_count,
            "compute_kind": self.compute_kind,
        }


_recorder = Recorder()


def recorder() -> Recorder:
    """This process's recorder (one per process; forked workers get their own copy)."""
    return _recorder


class phase:  # noqa: N801 (used like a function: ``with phase("allreduce"):``)
    """Context manager: be in phase ``name`` inside the block, back in the previous one after it."""

    __slots__ = ("name", "_previous")

    def __init__(self, name: str) -> None:
        self.name = name
        self._previous = "setup"

    def __enter__(self) -> phase:
        self._previous = _recorder.set_phase(self.name)
        return self

    def __exit__(self, *exc: object) -> None:
        _recorder.set_phase(self._previous)


def set_phase(name: str) -> None:
    """Enter phase ``name`` (one of hpctrain.contract.heartbeat_files.PHASES, or your own word)."""
    _recorder.set_phase(name)


def step(number: int, epoch: int | None = None) -> None:
    """Optimizer step ``number`` is done."""
    _recorder.step(number, epoch)


def beat() -> None:
    """Progress without a new step."""
    _recorder.beat()


class Monitor:
    """The rank's heartbeat thread: writes the heartbeat file, samples the GPU, runs the hang watchdog.

    ``identity`` holds the fixed fields (rank, node, pid, job_id). ``watchdog``
    is called with the current time on every poll and may end the process;
    ``gpu`` returns ``{"gpu_util_pct": .., "gpu_mem_used_mb": ..}`` or None.
    ``tick`` does one round and is what the tests call, with their own clock.
    """

    def __init__(
        self,
        run_dir: Path,
        identity: dict[str, Any],
        *,
        interval_s: float,
        recorder: Recorder | None = None,
        watchdog: Callable[[float], None] | None = None,
        gpu: Callable[[], dict[str, float] | None] | None = None,
        gpu_metrics: bool = False,
        first_step: bool = False,
        clock: Callable[[], float] = time.time,
        poll_s: float = POLL_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.identity = identity
        self.interval_s = interval_s
        self.recorder = recorder or _recorder
        self.watchdog = watchdog
        self.gpu = gpu
        self.gpu_metrics = gpu_metrics  # rank 0 also appends its samples to metrics.jsonl
        # rank 0 also records when this start's first step was done (contract/starts.py)
        self.first_step_pending = first_step
        if first_step:
            self.recorder.first_step = None  # a step of an earlier start in this process is not this one's
        self.clock = clock
        self.poll_s = min(poll_s, interval_s)
        self.path = heartbeat_path(self.run_dir, int(identity["rank"]))
        self.writes = 0
        self._last_write: float | None = None
        self._written_milestone: tuple[bool, int | None, str] | None = None
        self._gpu_sample: dict[str, float] = {}
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Monitor:
        self._thread = threading.Thread(target=self._run, name="hpctrain-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self, final_phase: str | None = "done") -> None:
        """Stop the thread and write one last heartbeat (``final_phase`` None keeps the phase)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if final_phase is not None:
            self.recorder.set_phase(final_phase)
        self.write(self.clock())

    def tick(self, now: float) -> None:
        """One round: the watchdog, then the heartbeat (and GPU sample) when due or after a milestone."""
        if self.watchdog is not None:
            self._guard("watchdog", self.watchdog, now)
        if self.first_step_pending:
            self._guard("first step", self._record_first_step, now)
        if self._last_write is None or now - self._last_write >= self.interval_s:
            if self.gpu is not None:
                self._guard("gpu", self._sample_gpu, now)
            self.write(now)
        elif self.recorder.milestone() != self._written_milestone:
            self.write(now)

    def write(self, now: float) -> None:
        """Write the heartbeat file now (atomic); errors are logged once, never raised."""
        self._last_write = now
        self._written_milestone = self.recorder.milestone()
        if self._guard("write", self._write, now):
            self.writes += 1

    def heartbeat(self, now: float) -> dict[str, Any]:
        return {
            **self.identity,
            **self.recorder.snapshot(),
            **self._gpu_sample,
            "interval_s": self.interval_s,  # lets a reader tell a silent (frozen) rank from a quiet one
            "time": now,
        }

    def _write(self, now: float) -> None:
        if not self.run_dir.is_dir():
            raise OSError(f"run directory {self.run_dir} does not exist on this node (is it on a shared filesystem?)")
        write_json_atomic(self.path, self.heartbeat(now))

    def _record_first_step(self, now: float) -> None:
        first = self.recorder.first_step
        if first is None:
            return
        self.first_step_pending = False
        record_first_step(self.run_dir, done=first[1], global_step=first[0], job_id=self.identity.get("job_id"))

    def _sample_gpu(self, now: float) -> None:
        sample = self.gpu() if self.gpu is not None else None
        if not sample:
            return
        self._gpu_sample = sample
        if self.gpu_metrics:
            record = {"kind": "gpu", "rank": self.identity["rank"], "global_step": self.recorder.step_no, **sample}
            append_metrics(self.run_dir, record, now=now)  # one write of one line: never interleaves

    def _guard(self, what: str, action: Callable[[float], None], now: float) -> bool:
        try:
            action(now)
            return True
        except Exception as exc:  # the job matters more than its heartbeat
            if what not in self._warned:
                self._warned.add(what)
                log.warning("heartbeat %s failed (not retried in the log): %s", what, exc)
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick(self.clock())
            self._stop.wait(self.poll_s)
