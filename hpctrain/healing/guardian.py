"""The batch node's loss: a watcher on another node of a healing job, and the next start's look back.

When the node that runs the batch step dies, the supervisor dies with it, and
Slurm 22.05 (``--no-kill``) removes the node from the job, kills the batch
step and every step on it, and keeps the job RUNNING on the other nodes with
nothing left to do until the time limit (measured on the test cluster). So
the supervisor starts this watcher on another node (:class:`GuardianStep`:
``srun --overlap``, step name :data:`STEP_NAME`). It reads the supervisor's
record (``.hpctrain/supervisor.json``, rewritten every
:data:`~hpctrain.healing.record.RECORD_EVERY_S`): when the record is
older than :data:`SILENT_S` and the batch node's slurmd does not answer, it
records the node failure, requeues the job and sets ``ExcNodeList``. It ends
when the record says the supervisor ended, or belongs to another start.

The guardian writes its log (:func:`log_path`) itself, only when it has
something to say, so a run whose batch node lived has no empty log; srun's
own output for the step goes nowhere (``/dev/null``: a file there would be
created empty on every start).

When Slurm requeued the job without the guardian (it died too), the next
start finds the record not ended and asks Slurm about the old batch node
(:func:`blame_previous_start`). Torch-free.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctrain.contract.file_writes import open_append
from hpctrain.contract.rundir import guardian_log_path
from hpctrain.healing import decide
from hpctrain.healing.evidence import NodeProbe, last_step
from hpctrain.healing.record import HealRecord, load_spec

STEP_NAME = "hpctrain-guard"
POLL_S = 2.0
SILENT_S = 20.0  # the supervisor rewrites its record every heal_record.RECORD_EVERY_S
STOP_WAIT_S = 5.0  # for the guardian's srun to exit once ended
MAX_STARTS_AGAIN = 3  # a guardian that ended while its step trains is started again at most this often per step

Say = Callable[[str], None]


def log_path(run_dir: Path, job_id: str) -> Path:
    """The guardian's log, beside the job's other logs (every start of the job appends to it)."""
    return guardian_log_path(run_dir, job_id)


def log_writer(path: Path) -> Say:
    """A ``say`` that appends ``hpctrain guardian: LINE`` to ``path``, creating it only then."""

    def say(line: str) -> None:
        text = f"hpctrain guardian: {line}\n"
        try:
            with os.fdopen(open_append(path), "a", encoding="utf-8") as handle:
                handle.write(text)
        except OSError:
            sys.stderr.write(text)  # to srun, which drops it: nothing better is left

    return say


class GuardianStep:
    """The guardian's srun, started by the supervisor on a node other than its own: a spare first."""

    def __init__(self, srun: str, run_dir: Path, batch_node: str, environ: Mapping[str, str]) -> None:
        self.srun, self.run_dir, self.batch_node, self.environ = srun, run_dir, batch_node, dict(environ)
        self.process: subprocess.Popen[bytes] | None = None
        self.placement: tuple[list[str], list[str], list[str]] | None = None  # start()'s nodes, for keep_up
        self.started_again = 0

    def start(self, allocation: Sequence[str], excluded: Sequence[str], step_nodes: Sequence[str]) -> None:
        """Start it unless it runs; a node of the allocation that is neither excluded nor the batch node.
        A new step: the guardian may be started again (:meth:`keep_up`) up to ``MAX_STARTS_AGAIN`` times."""
        self.placement, self.started_again = (list(allocation), list(excluded), list(step_nodes)), 0
        self._start()

    def keep_up(self) -> str | None:
        """Start the guardian again when it ended while the step trains (its srun failed, or it did: it leaves
        on its own only once the record says ended, or when it took the batch node out, and then the
        supervisor is gone too); the line to log, or None. The supervisor calls it while its step runs."""
        if self.process is None or self.process.poll() is None:  # a process means start() set the placement
            return None
        if self.started_again >= MAX_STARTS_AGAIN:
            return None
        self.started_again += 1
        code = self.process.returncode
        self._start()
        log = log_path(self.run_dir, self.environ.get("SLURM_JOB_ID", "local"))
        return (
            f"the guardian's step ended (exit {code}) while the run trains; started again "
            f"({self.started_again} of {MAX_STARTS_AGAIN}; its log, if it said why: {log})"
        )

    def _start(self) -> None:
        if (self.process is not None and self.process.poll() is None) or self.placement is None:
            return
        allocation, excluded, step_nodes = self.placement
        others = [n for n in allocation if n not in excluded and n != self.batch_node]
        others.sort(key=lambda n: n in step_nodes)  # a spare first: it has the most room
        if not others:
            return
        argv = [
            self.srun,
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={others[0]}",
            f"--job-name={STEP_NAME}",
            "--output=/dev/null",  # the guardian writes its own log, when it has something to say
            "--error=/dev/null",
            sys.executable,
            "-m",
            "hpctrain.healing.guardian",
            str(self.run_dir),
            self.batch_node,
        ]
        self.process = subprocess.Popen(argv, env=self.environ, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        """The record says ended: the guardian leaves within its poll; else its srun is ended."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout=2 * POLL_S + STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()


def guard(
    record: HealRecord,
    probe: NodeProbe,
    batch_node: str,
    say: Say,
    *,
    poll_s: float = POLL_S,
    silent_s: float = SILENT_S,
) -> int:
    """Watch ``batch_node`` for the start ``record`` describes; this step's exit status.

    The supervisor is silent when its record is older than ``silent_s`` by this node's clock, or when
    its ``time`` has not changed for ``silent_s`` by this node's monotonic clock: a time in the future
    (another node's clock ahead, or a planted record) never hides a dead batch node. An unreadable
    record is not the end of the watch: the guardian says so once and judges the batch node by its
    slurmd alone. It leaves when the record says ended, or belongs to another start.
    """
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # the job ends or is requeued
    watch = RecordWatch(silent_s)
    last: dict[str, Any] = {}
    while True:
        seen, unreadable = record.load_record()
        if seen is not None:
            if seen.get("job_id") != record.job_id or seen.get("restart") != record.restart or seen.get("ended"):
                return 0
            last = seen
        for line in watch.see(seen, unreadable):
            say(line)
        if watch.silent() and probe.lost_reason(batch_node) is not None:
            return take_out(record, batch_node, last)
        time.sleep(poll_s)


class RecordWatch:
    """When the supervisor last proved alive: its record's ``time`` changing, seen by this node's clocks."""

    def __init__(self, silent_s: float) -> None:
        self.silent_s = silent_s
        self.written: object = None  # the record's last time
        self.changed_at = time.monotonic()  # when it last changed
        self.stale = False  # the record's time is older than silent_s by the wall clock
        self.said: set[str] = set()

    def see(self, seen: dict[str, Any] | None, unreadable: str | None) -> list[str]:
        """Take one reading; the lines worth a log entry (each kind once)."""
        lines = []
        if seen is None:
            lines.append(
                (
                    "unreadable",
                    f"the supervisor's record is unreadable ({unreadable}); judging the batch "
                    "node by its slurmd once the record stops changing",
                )
            )
        else:
            written = seen.get("time")
            if written != self.written:
                self.written, self.changed_at = written, time.monotonic()
            number = isinstance(written, (int, float)) and not isinstance(written, bool) and math.isfinite(written)
            ahead = number and written - time.time() > self.silent_s
            self.stale = not number or time.time() - written > self.silent_s
            if ahead:
                lines.append(
                    (
                        "ahead",
                        f"the supervisor's record is dated {written - time.time():.0f} s ahead of "
                        "this node's clock; the batch node is judged by whether the record changes",
                    )
                )
        fresh = [text for kind, text in lines if kind not in self.said]
        self.said.update(kind for kind, _ in lines)
        return fresh

    def silent(self) -> bool:
        return self.stale or time.monotonic() - self.changed_at > self.silent_s


def take_out(record: HealRecord, batch_node: str, seen: dict[str, Any]) -> int:
    """Close the record (the next start knows), then lose the batch node: the run requeues without it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue's SIGTERM: ExcNodeList comes after it
    nodes = seen.get("nodes")
    record.write_record(nodes if isinstance(nodes, list) else [], ended=True, batch_node=batch_node)
    decision = lose_batch_node(record, batch_node, "the batch step's node does not answer")
    return 0 if decision.action == "requeue" else 1


def blame_previous_start(record: HealRecord, probe: NodeProbe) -> None:
    """When this job's previous start ended with its batch step (its record never says ended) and Slurm
    now marks that node bad, the node went down with it: record it, and keep it out."""
    seen = record.read_record()
    node, restart = seen.get("batch_node"), seen.get("restart")
    if seen.get("job_id") != record.job_id or seen.get("ended") or not isinstance(node, str):
        return
    if not isinstance(restart, int) or restart >= record.restart or node in record.excluded:
        return
    state = probe.node_states([node]).get(node)
    if state is None or not decide.bad_node_state(state):
        return
    lose_batch_node(record, node, f"the batch step's node went down (Slurm marks it {state})", requeued_by_slurm=True)


def lose_batch_node(record: HealRecord, node: str, reason: str, *, requeued_by_slurm: bool = False) -> decide.Decision:
    """The batch node ``node`` is lost: the decider's answer (requeue without it, or fail), carried out."""
    step = last_step(record.run_dir, [node])
    situation = record.situation(
        [decide.Blame(node, reason)],
        step_nodes=(),
        allocation=(),
        step=step,
        batch_node=node,
        requeued_by_slurm=requeued_by_slurm,
    )
    return record.carry_out(situation, decide.decide(situation))


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hpctrain.healing.guardian RUN_DIR BATCH_NODE", file=sys.stderr)
        return 2
    run_dir, environ = Path(argv[0]), dict(os.environ)
    say = log_writer(log_path(run_dir, environ.get("SLURM_JOB_ID", "local")))
    try:
        record = HealRecord(run_dir, load_spec(run_dir), environ, say=say)
        return guard(record, NodeProbe(), argv[1], say)
    except Exception:  # srun's output goes nowhere: the log is where a failure can be read
        say("failed:\n" + traceback.format_exc())
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
