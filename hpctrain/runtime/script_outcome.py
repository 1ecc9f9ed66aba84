"""How a start of a ``script:`` job ends, as the run records it: completed, stopped, or failed, naming the
process whose script failed first, with its exit code or signal and its last lines of output.

Every task whose script fails (not on a stop) records its exit in
``.hpctrain/script-exits/ATTEMPT/task-N.json`` before its task ends. The main
task (global rank 0's, or node task 0's) writes ``summary.json``: at start,
``running``; at the end, ``completed``, ``stopped`` or ``failed``. Which task
failed *first* comes from srun's report (``srun: error: NODE: task N: ...``,
or the torchrun launcher's same lines in ``torchrun-failures.log``), read by
a thread of the main task while its own script still runs (:class:`FailureWatch`),
since Slurm may kill it KillWait seconds later. A failure whose last lines
read like a peer's death ("Connection closed by peer", a gloo error) is the
echo of another's and is named only when nothing else is. Torch-free.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import read_json_object, script_exit_path, write_json_atomic
from hpctrain.contract.srun_report import TaskFailure, task_failures
from hpctrain.contract.summary import CARRIED_SUMMARY_KEYS, Summary, kept_fields, read_summary
from hpctrain.contract.summary import write_summary as write_summary_file
from hpctrain.errors import HpctrainError, printable
from hpctrain.runtime.failures import NewLines, PollingWatch, looks_like_peer_failure

# What a new start keeps of the last summary: the node records (a burn-in's among them) and when the run began.
CARRIED_KEYS = (*CARRIED_SUMMARY_KEYS, "started_at")
PEER_WAIT_S = 3.0  # for srun's report of the task that failed first, when our own failure looks like its echo
RECORD_WAIT_S = 1.0  # for a reported task's exit record (written just before its task ended)
WATCH_POLL_S = 0.5


class ScriptFailed(HpctrainError):
    """A process's script failed: it exited non-zero (or was killed) without being asked to stop."""


class PeerFailed(ScriptFailed):
    """Another process's script failed first; this one only ended with the step."""


@dataclass(frozen=True)
class ScriptExit:
    """How one task's script failed."""

    task: int  # the index srun's report names: the global rank, or the node task's index per node
    rank: int | None  # None for a script per node
    node: str
    code: int | None
    signal_name: str | None
    reason: str  # "exited with code 3", "killed by SIGKILL", "silent for 600 s"
    stderr: list[str] = field(default_factory=list)

    @property
    def peer(self) -> bool:
        """Whether its last lines read like the echo of another process's death."""
        return looks_like_peer_failure(RuntimeError("\n".join(self.stderr[-5:])))

    @property
    def who(self) -> str:
        return (
            f"rank {self.rank} on {self.node}" if self.rank is not None else f"node {self.node} (node task {self.task})"
        )

    @classmethod
    def parse(cls, data: dict[str, Any] | None) -> ScriptExit | None:
        """A record as written, or None; any field of the wrong type makes it unreadable, never an error."""
        if not data:
            return None
        try:
            stderr = [str(line)[:400] for line in data.get("stderr", [])][-40:]
            rank = data.get("rank")
            code = data.get("code")
            return cls(
                int(data["task"]),
                int(rank) if rank is not None else None,
                str(data["node"]),
                int(code) if code is not None else None,
                str(data["signal_name"]) if data.get("signal_name") is not None else None,
                str(data["reason"]),
                stderr,
            )
        except (KeyError, TypeError, ValueError):
            return None


def record_exit(run_dir: Path, attempt: str, failed: ScriptExit) -> None:
    """Leave ``failed`` for the main task; a write that fails is said in the log, never raised."""
    try:
        write_json_atomic(script_exit_path(run_dir, attempt, failed.task), asdict(failed))
    except OSError as exc:
        print(f"hpctrain: could not record how the script of task {failed.task} failed: {exc}", file=sys.stderr)


def read_exit(run_dir: Path, attempt: str, task: int, wait_s: float = 0.0) -> ScriptExit | None:
    """Task ``task``'s exit record of this start, waiting up to ``wait_s`` for it to appear."""
    deadline = time.monotonic() + wait_s
    while True:
        found = ScriptExit.parse(read_json_object(script_exit_path(run_dir, attempt, task)))
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def recorded_exits(run_dir: Path, attempt: str, limit: int = 64) -> list[ScriptExit]:
    """The exit records of this start so far, lowest task first (at most ``limit`` are read)."""
    folder = script_exit_path(run_dir, attempt, 0).parent
    try:
        names = sorted(entry.name for entry in folder.iterdir() if entry.name.startswith("task-"))[:limit]
    except OSError:
        return []
    found = (ScriptExit.parse(read_json_object(folder / name)) for name in names)
    return [one for one in found if one is not None]


class StepReport:
    """srun's (or the torchrun launcher's) report of failed tasks, from where the file ended at start."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._new = NewLines(self.path)
        self._found: list[TaskFailure] = []  # what the lines read so far reported (the lines are not kept)
        self._lock = threading.Lock()

    def failures(self) -> list[TaskFailure]:
        """Every task reported failed so far this start, first first."""
        with self._lock:
            self._found += task_failures(self._new.read())  # whole lines only: each is parsed once
            return list(self._found)


def choose_first(reported: list[TaskFailure], exits: dict[int, ScriptExit], own: ScriptExit | None) -> Any:
    """The failure to name: srun's order (our own last, it has not ended yet), the first whose script did not
    just echo a peer's death. Returns the ScriptExit when its record is there, else srun's TaskFailure. Pure."""
    order: list[TaskFailure | ScriptExit] = []
    for failure in reported:
        if own is not None and failure.rank == own.task:
            order.append(own)
        else:
            order.append(exits.get(failure.rank, failure))
    if own is not None and own not in order:
        order.append(own)
    for candidate in order:
        if not (isinstance(candidate, ScriptExit) and candidate.peer):
            return candidate
    return order[0] if order else None


def failure_fields(found: ScriptExit | TaskFailure) -> dict[str, Any]:
    """summary.json's words for the first failure."""
    if isinstance(found, TaskFailure):  # a task whose record is missing: it died before it could write one
        return {
            "failed_rank": found.rank,
            "failed_node": found.node,
            "failed_reason": found.reason,
            "error": f"task {found.rank} on {found.node}: {found.reason}",
        }
    fields: dict[str, Any] = {
        "failed_rank": found.rank,
        "failed_node": found.node,
        "failed_reason": f"the script {found.reason}",
        "failed_exit_code": found.code,
        "failed_signal": found.signal_name,
        "failed_stderr": found.stderr,
        "error": f"the script of {found.who} {found.reason}",
    }
    return {key: value for key, value in fields.items() if value is not None}


def say_failure(found: ScriptExit | TaskFailure) -> None:
    """The log's account of the first failure (global rank 0's stderr, which is also the batch log's)."""
    if isinstance(found, TaskFailure):
        print(f"hpctrain: task {found.rank} on {found.node} failed first: {found.reason}", file=sys.stderr)
    else:
        tail = "".join(f"\n  | {printable(line)}" for line in found.stderr)
        print(f"hpctrain: the script of {found.who} failed first: it {found.reason}{tail}", file=sys.stderr)
    sys.stderr.flush()


class ScriptSummary:
    """The main task's summary.json of one start of a script run; inert on every other task."""

    def __init__(self, run_dir: Path, facts: dict[str, Any], *, enabled: bool) -> None:
        self.run_dir, self.enabled = Path(run_dir), enabled
        self.started = time.monotonic()
        previous = (read_summary(self.run_dir) or Summary()) if enabled else Summary()
        kept = previous.fields()
        self.static = {key: kept[key] for key in CARRIED_KEYS if key in kept} | facts
        self.static.setdefault("started_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.prior_wall_s = float(previous.wall_s or 0.0)
        self.failure_recorded = False
        self.first_write = True  # before the script runs: only CARRIED_KEYS of an earlier attempt are kept
        self._lock = threading.Lock()

    def write(self, status: str, **fields: Any) -> None:
        """Write ``status``; once a failure is recorded, nothing but a failure overwrites it."""
        if not self.enabled:
            return
        with self._lock:
            if self.failure_recorded and status != "failed":
                return
            # a healing job's supervisor adds lost nodes meanwhile, and the script its own fields (set_summary)
            carried = kept_fields(read_summary(self.run_dir), CARRIED_KEYS if self.first_write else None)
            self.first_write = False
            summary = {
                **self.static,
                **carried,
                **fields,
                "status": status,
                "wall_s": round(self.prior_wall_s + time.monotonic() - self.started, 3),
                "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            try:
                write_summary_file(self.run_dir, summary)
            except OSError as exc:
                print(f"hpctrain: could not write summary.json: {exc}", file=sys.stderr)
            self.failure_recorded = self.failure_recorded or status == "failed"


class FailureWatch(PollingWatch):
    """The main task's watch of the step's report: records the first failed task while its own script runs."""

    def __init__(self, report: StepReport, run_dir: Path, attempt: str, summary: ScriptSummary) -> None:
        super().__init__("hpctrain-script-failures", WATCH_POLL_S)
        self.report, self.run_dir, self.attempt, self.summary = report, Path(run_dir), attempt, summary
        self.found: ScriptExit | TaskFailure | None = None
        self._done = threading.Lock()

    def reported(self, wait_s: float) -> bool:
        """Whether a failed task is reported, waiting up to ``wait_s`` for a report (a line may trail the
        SIGTERM that ended this task: torchrun's node task writes it after it saw the rank die)."""
        deadline = time.monotonic() + wait_s
        while not self.report.failures():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def look(self) -> bool:
        if not self.report.failures():
            return False
        self.settle(None, wait_s=RECORD_WAIT_S)
        return True

    def settle(self, own: ScriptExit | None, wait_s: float) -> ScriptExit | TaskFailure | None:
        """Name the first failure (waiting up to ``wait_s`` for srun's report and the records), once."""
        with self._done:
            if self.found is not None:
                return self.found
            deadline = time.monotonic() + wait_s
            while True:
                reported = self.report.failures()
                exits = {f.rank: e for f in reported if (e := read_exit(self.run_dir, self.attempt, f.rank))}
                complete = reported and all(f.rank in exits for f in reported)
                if complete or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
            found = choose_first(reported, exits, own)
            if found is not None:
                self.found = found
                self.summary.write("failed", **failure_fields(found))
                say_failure(found)
            return found
