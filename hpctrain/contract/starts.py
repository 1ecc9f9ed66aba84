"""``RUN/.hpctrain/starts.jsonl``: when each start of a run began and when its first step was done. Torch-free.

Every start of a run (the first, a requeue, a preemption's restart, a
relaunch after a lost node, ``hpctrain resume``) costs time before it trains
again: the interpreter, imports, the process group, the data index, the
checkpoint's load, the first (often slower) step. That cost is what a plan
charges each chunk (``planning/timeline.py``), so the run records it:

* the program that starts a task (``programs/``) appends a ``start`` line
  on global rank 0 as soon as it knows it is rank 0: ``began`` is when the
  program's process started (:func:`process_began`; a torchrun node launcher
  hands its own down to its workers in :data:`BEGAN_VAR`), ``step_before``
  the run's step when it began (:func:`step_reached`: its summary, or its
  last logged step), ``job_id`` Slurm's (or the local run's) job;
* rank 0's heartbeat thread (``runtime/heartbeat.py``) appends a
  ``first_step`` line once the first optimizer step of that start is done:
  ``done`` is when the step was done, ``global_step`` its number.

A start's cost is ``done - began``, plus the steps it had to train again
(``step_before`` beyond the checkpoint it resumed, ``global_step - 1``) at
the run's step time, when both are known (:meth:`Start.cost_s`). One line is
one ``write`` on an ``O_APPEND`` descriptor (``file_writes.open_append``):
lines never interleave and nothing is rewritten. Readers read the last
:data:`MAX_LINES` lines at most, regular files inside the run only, and drop
a line that is not a record of this shape (torn, garbage, implausible
numbers); a first step pairs with the start line before it.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hpctrain.contract.file_writes import open_append
from hpctrain.contract.metrics import parse_metric_lines
from hpctrain.contract.rundir import CONTROL_DIR, metrics_path, run_home
from hpctrain.contract.runfiles import RunFileError, load_json, plausible, tail_lines
from hpctrain.contract.summary import read_summary

STARTS_NAME = "starts.jsonl"
BEGAN_VAR = "HPCTRAIN_START_BEGAN"  # epoch seconds: when the outermost program of this start began
MAX_LINES = 512  # of the file, only the newest lines are read (two per start)
MAX_BYTES = 256 << 10
_MAX_JOB_ID = 64
METRICS_TAIL_LINES = 64  # of metrics.jsonl, the lines a start reads for the step its run had reached
MAX_BEFORE_S = 600.0  # a process that started longer before its program's first line is not this start's


def starts_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONTROL_DIR / STARTS_NAME


# ------------------------------------------------------------------ writing


def _append(run_dir: str | Path, record: Mapping[str, Any]) -> None:
    path = starts_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_append(path)
    try:
        os.write(fd, (json.dumps(dict(record), allow_nan=False) + "\n").encode())
    finally:
        os.close(fd)


def record_start(run_dir: str | Path, *, began: float, job_id: str | None, step_before: int | None) -> None:
    """Append a ``start`` line (global rank 0, once per start). Raises OSError."""
    record: dict[str, Any] = {"kind": "start", "began": round(began, 3), "job_id": job_id}
    if step_before is not None:
        record["step_before"] = int(step_before)
    _append(run_dir, record)


def record_first_step(run_dir: str | Path, *, done: float, global_step: int, job_id: str | None) -> None:
    """Append a ``first_step`` line (rank 0's heartbeat thread, once per start). Raises OSError."""
    _append(run_dir, {"kind": "first_step", "done": round(done, 3), "global_step": int(global_step), "job_id": job_id})


def process_began(now: float, *, proc: Path = Path("/proc")) -> float:
    """When this process started (Linux: ``/proc/self/stat``'s start time against ``/proc/uptime``), so a
    start's cost includes the interpreter and the imports before the program's first line; ``now`` where
    /proc cannot say, or says more than :data:`MAX_BEFORE_S` earlier (a program called inside a process
    that lived on before it, such as a test's, did not begin then)."""
    try:
        fields = (proc / "self" / "stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: after the name, the 20th
        uptime = float((proc / "uptime").read_text().split()[0])
        began = now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return now
    return began if now - MAX_BEFORE_S <= began <= now else now


def step_reached(run_dir: str | Path) -> int | None:
    """The run's step when a start begins: the larger of ``summary.json``'s ``global_step`` and the last logged
    ``train_step`` (a killed start logged steps its summary never said); None when neither says. Never raises."""
    summary = read_summary(Path(run_dir))
    steps = [summary.global_step] if summary is not None and summary.global_step is not None else []
    try:
        tail, _size = tail_lines(metrics_path(Path(run_dir)), METRICS_TAIL_LINES, within=run_home(Path(run_dir)))
    except (OSError, RunFileError):
        tail = b""
    records, _notes = parse_metric_lines(tail.splitlines(keepends=True), kinds=("train_step",), timed=False)
    steps += [r["global_step"] for r in records if isinstance(r.get("global_step"), int) and r["global_step"] >= 0]
    return max(steps) if steps else None


def began_from(environ: Mapping[str, str], fallback: float) -> float:
    """When this start began: :data:`BEGAN_VAR` where an outer program of this start set it (and it is a
    plausible time no later than ``fallback``), else ``fallback`` (the caller's first line)."""
    try:
        value = float(environ.get(BEGAN_VAR, ""))
    except ValueError:
        return fallback
    return value if 0 < value <= fallback else fallback


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Start:
    """One start of a run, as its lines say; ``first``: the run's first start (no start line and no trained
    step before it; any other is a restart: a requeue, a preemption's restart, a relaunch, a resume)."""

    began: float
    job_id: str | None = None
    step_before: int | None = None
    done: float | None = None  # when its first step was done; None: none yet (or it never trained)
    first_step: int | None = None
    first: bool = False

    @property
    def startup_s(self) -> float | None:
        """Seconds from the start's first line to its first step done."""
        if self.done is None or self.done < self.began:
            return None
        return self.done - self.began

    @property
    def redone_steps(self) -> int | None:
        """Steps this start trained again: the run's step when it began beyond the checkpoint it resumed."""
        if self.step_before is None or self.first_step is None:
            return None
        return max(0, self.step_before - (self.first_step - 1))

    def cost_s(self, step_s: float | None = None) -> float | None:
        """The start's cost: its start-up, plus its redone steps at ``step_s`` when both are known."""
        startup = self.startup_s
        if startup is None:
            return None
        redone = self.redone_steps
        return startup + (redone * step_s if redone and step_s is not None and step_s > 0 else 0.0)

    def as_json(self, step_s: float | None = None) -> dict[str, Any]:
        return {
            "began": self.began,
            "job_id": self.job_id,
            "first": self.first,
            "first_step_done": self.done,
            "first_step": self.first_step,
            "step_before": self.step_before,
            "startup_s": self.startup_s,
            "redone_steps": self.redone_steps,
            "cost_s": self.cost_s(step_s),
        }


def _time(value: Any) -> float | None:
    return float(value) if plausible(value) and value > 0 else None


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and plausible(value) and value >= 0 else None


def _job(value: Any) -> str | None:
    return value[:_MAX_JOB_ID] if isinstance(value, str) else None


def parse_starts(lines: Iterable[bytes], *, whole_file: bool = True) -> list[Start]:
    """The starts of these lines, oldest first; a ``first_step`` pairs with the start line before it (the
    first one after it only). ``whole_file``: the lines begin at the file's start (so its first start is the
    run's first)."""
    starts: list[Start] = []
    for line in lines:
        try:
            record = load_json(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(record, dict):
            continue
        if record.get("kind") == "start" and (began := _time(record.get("began"))) is not None:
            before = _count(record.get("step_before"))
            first = whole_file and not starts and not before  # a start after trained steps restarts the run
            starts.append(Start(began, _job(record.get("job_id")), before, first=first))
        elif record.get("kind") == "first_step" and starts and starts[-1].done is None:
            done, step = _time(record.get("done")), _count(record.get("global_step"))
            if done is not None and step is not None:
                starts[-1] = replace(starts[-1], done=done, first_step=step)
    return starts


def read_starts(run_dir: str | Path) -> list[Start]:
    """The run's recorded starts, oldest first; [] when none or unreadable (never raises)."""
    try:
        data, size = tail_lines(starts_path(run_dir), MAX_LINES, MAX_BYTES, within=run_home(Path(run_dir)))
    except (OSError, RunFileError):
        return []
    return parse_starts(data.splitlines(), whole_file=len(data) == size)


def median_cost(starts: Iterable[Start], step_s: float | None = None) -> float | None:
    """The median cost of the starts that have one; None when none has."""
    costs = [cost for start in starts if (cost := start.cost_s(step_s)) is not None]
    return statistics.median(costs) if costs else None
