"""The hang watchdog: a rank that stops making progress ends the job, with stacks and a culprit.

**No progress** means: the rank's recorder (``runtime/heartbeat.py``) saw no
completed step, no phase change and no ``beat()`` for ``distributed.hang_timeout_s``
seconds. Three exceptions, so that legitimately long waits are not hangs:

* the watchdog is armed only by the rank's first completed step of the
  attempt (``heartbeat.step``): start-up, data-loader warm-up, the first
  step's compilation and cuDNN autotuning are left to ``distributed.timeout_s``;
* ``checkpoint`` and ``done`` are paused phases: time spent in them never
  counts (rank 0 writing a large checkpoint is slow, not stuck; a finished
  rank may wait for Slurm to requeue it);
* ``validation`` is not paused but beats once per batch, so only a batch that
  takes the whole timeout counts.

A stuck rank stops progressing, and so do the ranks that wait for it in the
next collective, so every rank's watchdog fires within about a step of each
other. Each one then, in its own heartbeat thread:

1. writes its heartbeat as it stands and dumps all its threads' Python stacks
   (``faulthandler``) to ``stacks/rank-NNNNN.txt``; its data-loader workers
   write theirs to the task's stderr log (``runtime/child_stacks.py``);
2. tries to create the job's claim marker with ``O_EXCL``: exactly one rank wins;
3. the winner waits a grace period (the others dump meanwhile), reads every
   heartbeat of this job, names the culprit (:func:`culprit`) and writes
   ``status: failed``, ``hung_rank``, ``hung_node``, ``hung_phase``,
   ``failed_reason`` and ``stack_dumps`` into ``summary.json``; the others
   wait (bounded) until that summary is there;
4. every rank ends with ``os._exit(HANG_EXIT_CODE)``: no interpreter shutdown
   (it can block in NCCL or data-loader teardown). Under ``srun
   --kill-on-bad-exit=1`` the step ends at once; the task reaper
   (``runtime/cleanup.py``) ends data-loader workers. A hang is a failure,
   never a stop: nothing requeues it (``runtime/requeue.py`` handles only the
   trainer's stop results) and ``runtime/failures.py`` keeps the hang report
   when srun then reports the exited tasks.

**Who is the culprit.** A rank whose heartbeat thread stopped writing while
the others' went on is *frozen* as a whole process (stopped by SIGSTOP, blocked
in the kernel, stuck in native code that holds the GIL, or on a node that no
longer answers): its file is older than its own write interval allows, so the
step and phase in it are only its last recorded ones, and the report says so
(``hung_frozen_s``). Otherwise the rank that stopped first is named
(``hpctrain.contract.heartbeat_files.first_stopped``: lowest step, then oldest progress:
entering its phase or its last beat).

Torch-free.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hpctrain.contract.file_writes import open_append, write_atomic
from hpctrain.contract.heartbeat_files import Heartbeat, first_stopped, read_heartbeats
from hpctrain.contract.rundir import hang_claim_path, stack_dump_path, stacks_dir
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.runtime.child_stacks import ask_workers_for_stacks, silent_workers
from hpctrain.runtime.cleanup import leave_dataset_mount
from hpctrain.runtime.heartbeat import Recorder

HANG_EXIT_CODE = 87  # distinct from Python's 1 and from signals' 128+N: "ended by the hang watchdog"
PAUSED_PHASES = frozenset({"checkpoint", "done"})
GRACE_MIN_S, GRACE_MAX_S = 5.0, 60.0
REPORT_WAIT_S = 90.0  # how long a rank that lost the claim waits for the winner's summary
SILENT_MARGIN_S = 5.0  # beyond two write intervals: a live heartbeat thread is never this late


class ProgressWatch:
    """When the recorder last moved, in the watchdog's own clock. Pure apart from its two fields."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._seen: int | None = None
        self._since = 0.0

    def stalled_s(self, recorder: Recorder, now: float) -> float | None:
        """Seconds without progress, or None while the watchdog is not armed or the phase is paused."""
        if recorder.changes != self._seen:
            self._seen, self._since = recorder.changes, now
        if not recorder.armed or recorder.phase_name in PAUSED_PHASES:
            self._since = now  # time in a paused phase never counts
            return None
        return now - self._since

    def hung(self, recorder: Recorder, now: float) -> bool:
        stalled = self.stalled_s(recorder, now)
        return stalled is not None and stalled >= self.limit_s


def grace_s(step_times: Iterable[float]) -> float:
    """How long the reporting rank waits for the others to dump: 5 s plus two median steps, at most 60 s."""
    times = sorted(step_times)
    median = times[len(times) // 2] if times else 0.0
    return min(GRACE_MAX_S, GRACE_MIN_S + 2 * median)


def silent_s(beat: Heartbeat, now: float) -> float | None:
    """How long ``beat``'s heartbeat thread has been silent beyond what its interval allows, or None.

    A live thread rewrites the file at least every ``interval_s``; one that has
    not for two intervals and a margin is frozen with its process. Files that do
    not record their interval, and finished ranks, are never called silent.
    """
    if beat.interval_s is None or beat.phase == "done":
        return None
    age = now - beat.time
    return age if age > 2 * beat.interval_s + SILENT_MARGIN_S else None


def culprit(beats: list[Heartbeat], now: float) -> tuple[Heartbeat, float | None] | None:
    """The rank to blame and, when its whole process froze, for how long its heartbeat has been silent.

    A frozen rank is blamed before any rank that is merely waiting: the others
    wait for it, and what its file says is older than what theirs say. Among
    several frozen ranks, the one that went silent first.
    """
    frozen = [(beat, silent) for beat in beats if (silent := silent_s(beat, now)) is not None]
    if frozen:
        return max(frozen, key=lambda pair: (pair[1], -pair[0].rank))
    stopped = first_stopped(beats)
    return None if stopped is None else (stopped, None)


def hang_report(beats: Iterable[Heartbeat], job_id: str | None, now: float, run_dir: Path) -> dict[str, Any] | None:
    """The summary fields naming the culprit among job ``job_id``'s heartbeats. Pure."""
    mine = [beat for beat in beats if job_id is None or beat.job_id == job_id]
    found = culprit(mine, now)
    if found is None:
        return None
    beat, frozen_s = found
    where = f"rank {beat.rank} on node {beat.node}"
    if frozen_s is not None:
        reason = (
            f"hang: {where} stopped responding: its heartbeat has been silent for {frozen_s:.0f} s (the whole "
            "process is frozen: stopped by a signal, blocked in the kernel or in native code holding the GIL, "
            f"or its node no longer answers); last recorded: phase {beat.phase} at step {beat.step}"
        )
    else:
        stalled = max(0.0, now - max(beat.phase_since, beat.last_progress))
        reason = f"hang: {where} made no progress in phase {beat.phase} for {stalled:.0f} s (step {beat.step})"
    return {
        "status": "failed",
        "hung_rank": beat.rank,
        "hung_node": beat.node,
        "hung_phase": beat.phase,
        "hung_step": beat.step,
        "hung_frozen_s": None if frozen_s is None else round(frozen_s, 1),
        "failed_rank": beat.rank,
        "failed_node": beat.node,
        "failed_reason": reason,
        "error": reason,
        "stack_dumps": str(stacks_dir(run_dir)),
        "hang_job_id": job_id,
    }


def record_hang(run_dir: Path, fields: dict[str, Any]) -> None:
    """Merge the hang report into summary.json (the one rank holding the claim only)."""
    previous = read_summary(run_dir)
    summary = previous.fields() if previous is not None else {}
    summary.update(fields)
    write_summary(run_dir, summary)


def claim_report(run_dir: Path, job_id: str) -> bool:
    """Whether this rank is the one to write the report (creates the marker; exactly one rank wins)."""
    path = hang_claim_path(run_dir, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, f"{os.getpid()}\n", exclusive=True, mode=0o644)
    except FileExistsError:
        return False
    return True


def dump_stacks(path: Path, header: str) -> None:
    """Every thread's Python stack into ``path`` (faulthandler: works while other threads are stuck)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_append(path)  # never through a link
    try:
        os.ftruncate(fd, 0)
        os.write(fd, (header + "\n\n").encode())
        faulthandler.dump_traceback(file=fd, all_threads=True)
    finally:
        os.close(fd)


def note_worker_stacks(path: Path, workers: list[int], silent: list[str] | None = None) -> None:
    """Say in the rank's stack dump where its data-loader workers' stacks went (the task's stderr log), and
    which workers could not answer (``child_stacks.silent_workers``)."""
    line = ""
    if workers:
        pids = ", ".join(str(pid) for pid in workers)
        line += f"\nThis rank's data-loader workers (pids {pids}) wrote their stacks to this task's stderr log.\n"
    if silent:
        line += f"\nThis rank's data-loader workers that could not answer (no handler yet): {'; '.join(silent)}.\n"
    if not line:
        return
    try:
        fd = open_append(path)
    except OSError:
        return
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def report_written(run_dir: Path, job_id: str) -> bool:
    summary = read_summary(run_dir)
    return summary is not None and summary.hung_rank is not None and summary.hang_job_id == job_id


class HangWatchdog:
    """Called by the heartbeat thread with the time; ends the process when the rank stopped progressing.

    ``flush`` writes this rank's heartbeat now. ``exit``, ``sleep`` and
    ``clock`` are for tests (``exit`` must not return in production).
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        rank: int,
        node: str,
        job_id: str,
        limit_s: float,
        recorder: Recorder,
        flush: Callable[[float], None],
        exit: Callable[[int], object] = os._exit,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
        report_wait_s: float = REPORT_WAIT_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank, self.node, self.job_id = rank, node, job_id
        self.recorder = recorder
        self.watch = ProgressWatch(limit_s)
        self.flush = flush
        self.exit, self.sleep, self.clock = exit, sleep, clock
        self.report_wait_s = report_wait_s
        self.fired = False
        self.reported: dict[str, Any] | None = None

    def __call__(self, now: float) -> None:
        if not self.fired and self.watch.hung(self.recorder, now):
            self.fired = True
            self.fire(now)

    def fire(self, now: float) -> None:
        rec = self.recorder
        own = (
            f"hpctrain: rank {self.rank} on node {self.node}: no progress in phase {rec.phase_name} at step "
            f"{rec.step_no} for {self.watch.limit_s:.0f} s (distributed.hang_timeout_s); "
            f"stacks in {stack_dump_path(self.run_dir, self.rank)}"
        )
        _say(own)
        self.flush(now)
        try:
            dump_stacks(stack_dump_path(self.run_dir, self.rank), own)
        except OSError as exc:
            _say(f"hpctrain: rank {self.rank}: could not dump stacks: {exc}")
        note_worker_stacks(stack_dump_path(self.run_dir, self.rank), ask_workers_for_stacks(), silent_workers())
        try:
            self._report()
        except Exception as exc:  # the job must still end
            _say(f"hpctrain: rank {self.rank}: could not record the hang in summary.json: {exc}")
        leave_dataset_mount()  # os._exit skips every clean-up: the node's last task still unmounts
        _flush_stdio()
        self.exit(HANG_EXIT_CODE)

    def _report(self) -> None:
        if claim_report(self.run_dir, self.job_id):
            self.sleep(grace_s(self.recorder.step_times))
            fields = hang_report(read_heartbeats(self.run_dir), self.job_id, self.clock(), self.run_dir)
            if fields is not None:
                record_hang(self.run_dir, fields)
                self.reported = fields
                _say(f"hpctrain: {fields['failed_reason']}; ending the job (exit code {HANG_EXIT_CODE})")
            return
        deadline = self.clock() + self.report_wait_s
        while not report_written(self.run_dir, self.job_id) and self.clock() < deadline:
            self.sleep(0.5)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
