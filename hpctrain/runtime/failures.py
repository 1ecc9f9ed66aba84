"""Which task of a job failed first: read from srun's own report, written into summary.json by rank 0.

When one task dies (killed by the OOM killer or ``kill -9``, crashed, exited
non-zero), the others only see a broken collective ("Connection closed by
peer") and the dead task can write nothing. ``srun --kill-on-bad-exit`` does
know: it prints ``srun: error: NODE: task N: REASON`` to the batch step's
stderr -- submitit's ``<job>_0_log.err``, the same file as rank 0's stderr --
and then ends the other tasks (SIGTERM, SIGKILL after KillWait). So global
rank 0 records srun's first such line written since it started in
``summary.json`` (``status: failed``, ``failed_rank``, ``failed_node``,
``failed_reason``):

* a background thread (:class:`FailureWatch`) checks the log every 0.5 s,
  because rank 0's main thread may be stuck in a collective until SIGKILL;
* when rank 0's own code raises, it looks once more (waiting a little when
  the error looks like a peer's death); no line means rank 0 failed first.

A job whose rank 0 itself is killed keeps the summary it last wrote. The
report's parser is the contract's (``contract/srun_report.py``: ``status``
reads the same lines); nothing here imports torch.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TypeVar

from hpctrain.contract.srun_report import TaskFailure, first_task_failure
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import HpctrainError

# A collective broken by a peer that died, as gloo, NCCL and the TCPStore word it.
_PEER_FAILURE_WORDS = (
    "closed by peer",
    "reset by peer",
    "broken pipe",
    "remote worker",
    "connection refused",
    "nccl",
    "gloo",
    "socket",
)
WATCH_POLL_S = 0.5
PEER_WAIT_S = 3.0  # srun reports a dead task within milliseconds; KillWait (>= 5 s) bounds what we may spend

_Watch = TypeVar("_Watch", bound="PollingWatch")


def looks_like_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` may be the echo of another task's death rather than this task's own fault."""
    if isinstance(exc, HpctrainError):
        return False
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}:
        return True
    message = str(exc).lower()
    return any(word in message for word in _PEER_FAILURE_WORDS)


LOG_READ_LIMIT = 1 << 20  # bytes of a log read per look


class NewLines:
    """A log's complete lines written since this was made (earlier attempts of a requeued job wrote before).

    Each :meth:`read` returns what is new, at most ``limit`` bytes of it (the log is the job's, and a
    user's script may write into it: a progress bar redrawn with carriage returns for hours is one line
    that never ends); a line still being written is read next time, and a line longer than ``limit`` is
    passed over, so the lines after it are read. Not locked: its owner reads from one thread at a time.
    """

    def __init__(self, path: Path, limit: int = LOG_READ_LIMIT) -> None:
        self.path, self.limit = Path(path), max(1, limit)
        self._skipping = False  # inside a line longer than the limit: read on from its end
        try:
            self._pos = self.path.stat().st_size
        except OSError:
            self._pos = 0

    def read(self) -> str:
        """The complete lines written since the last read ("" when none, or the file cannot be read)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._pos)
                chunk = handle.read(self.limit)
        except OSError:
            return ""
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                self._pos += len(chunk)
                return ""
            self._pos += end + 1
            chunk, self._skipping = chunk[end + 1 :], False
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self._pos += len(complete)
        if not complete and len(chunk) == self.limit:  # one line as long as the limit, and no end yet
            self._pos += len(chunk)
            self._skipping = True
        return complete.decode(errors="replace")


class StepLog:
    """The batch step's stderr (where srun reports), from where it ended when this task started.

    Reads only what is new on each call; safe to call from several threads.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._new = NewLines(self.path)
        self._failure: TaskFailure | None = None
        self._lock = threading.Lock()

    def poll(self) -> TaskFailure | None:
        """The first failed task srun reported since this task started, or None (so far)."""
        with self._lock:
            if self._failure is None:
                self._failure = first_task_failure(self._new.read())
            return self._failure

    def wait_for_failure(self, timeout_s: float, poll_s: float = 0.1) -> TaskFailure | None:
        deadline = time.monotonic() + timeout_s
        while True:
            failure = self.poll()
            if failure is not None or time.monotonic() >= deadline:
                return failure
            time.sleep(poll_s)


class PollingWatch:
    """A daemon thread that calls :meth:`look` every ``poll_s`` until it returns True (its one job is
    done) or :meth:`stop` is called. What to look for is a subclass's."""

    def __init__(self, name: str, poll_s: float = WATCH_POLL_S) -> None:
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def start(self: _Watch) -> _Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def look(self) -> bool:
        raise NotImplementedError

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.look():
                return


class FailureWatch(PollingWatch):
    """Rank 0's background check of srun's report: names a dead task even while training is stuck.

    After a peer dies, rank 0's main thread may wait in a collective on a peer
    that is alive (and waiting too) and never error before Slurm's SIGKILL,
    KillWait seconds later (seen on the test cluster). A thread still runs then.
    """

    def __init__(self, run_dir: Path, step_log: StepLog, poll_s: float = WATCH_POLL_S) -> None:
        super().__init__("hpctrain-failure-watch", poll_s)
        self.run_dir = Path(run_dir)
        self.step_log = step_log
        self.recorded: TaskFailure | None = None

    def look(self) -> bool:
        failure = self.step_log.poll()
        if failure is None:
            return False
        try:
            record_failure(self.run_dir, failure)
            self.recorded = failure
        except OSError as exc:
            print(f"hpctrain: could not record the failure of task {failure.rank}: {exc}", file=sys.stderr)
        return True


def first_failure(
    exc: BaseException, own_rank: int, own_node: str, step_log: StepLog | None, wait_s: float = PEER_WAIT_S
) -> TaskFailure:
    """The task that failed first, as rank 0 sees it while handling ``exc``.

    A peer's death is reported by srun before or just after our collective
    breaks: wait up to ``wait_s`` for it. Our own error (a bug, a config
    mistake) needs no wait: no other task has failed yet.
    """
    found = None
    if step_log is not None:
        found = step_log.wait_for_failure(wait_s if looks_like_peer_failure(exc) else 0.0)
    if found is not None:
        return found
    return TaskFailure(own_rank, own_node, f"{type(exc).__name__}: {exc}")


def is_own_error(failure: TaskFailure, exc: BaseException, own_rank: int) -> bool:
    """Whether rank 0's failure is its own code's error (a bug, a config mistake), not the echo of a lost
    peer or node: no requeue can help it. Then rank 0 takes the job's ``Requeue`` flag away
    (``requeue.keep_ended``): with ``--requeue=expedite`` Slurm would otherwise keep the failed job
    pending in ``REQUEUE_HOLD`` (a non-zero exit whose epilogs found every node healthy; docs/preemption.md)."""
    return failure.rank == own_rank and not looks_like_peer_failure(exc)


def record_failure(run_dir: Path, failure: TaskFailure, exc: BaseException | None = None) -> None:
    """Mark the run failed in summary.json, naming the task that failed first (global rank 0 only).

    A hang report already there is kept: it names the cause, the exits that followed do not.
    """
    previous = read_summary(run_dir)
    if previous is not None and previous.status == "failed" and previous.hung_rank is not None:
        return  # the hang watchdog ended the job (runtime/hang.py): srun's report of the exits is its echo
    summary = previous.fields() if previous is not None else {}
    summary.update(
        {
            "status": "failed",
            "failed_rank": failure.rank,
            "failed_node": failure.node,
            "failed_reason": failure.reason,
        }
    )
    error = (
        f"{type(exc).__name__}: {exc}"
        if exc is not None
        else f"task {failure.rank} on {failure.node}: {failure.reason}"
    )
    summary.setdefault("error", error)
    write_summary(run_dir, summary)
