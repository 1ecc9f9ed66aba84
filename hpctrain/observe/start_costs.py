"""Each start of a run in words: when it began, how long until its first step, what it cost. Torch-free.

The record is ``contract/starts.py``'s (``RUN/.hpctrain/starts.jsonl``);
``hpctrain report`` lists every start among a run's facts, ``hpctrain status
RUN`` the last one (``last_start``). A start's cost is its start-up (first
step done minus the start's first line) plus the steps it trained again since
its checkpoint at the run's step time, where the run knows them. The job id
came from a file: it is escaped here, and the printers escape again.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpctrain.contract.runfiles import printable
from hpctrain.contract.starts import Start, read_starts

MAX_SHOWN = 20  # starts listed per run (the newest); a run with more says how many it left out


def start_text(start: Start, number: int, step_s: float | None = None) -> str:
    """``start 2 (restart, job 5) at 2026-11-29 03:12:00: first step (11) 45 s after it began, 2 steps trained
    again (1 s): cost 46 s``."""
    kind = "first start" if start.first else "restart"
    job = f", job {printable(start.job_id)}" if start.job_id else ""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start.began))
    head = f"start {number} ({kind}{job}) at {when}"
    startup = start.startup_s
    if startup is None:
        return f"{head}: no first step recorded (still starting, or it ended before training)"
    text = f"{head}: first step ({start.first_step}) {startup:.0f} s after it began"
    redone = start.redone_steps
    if redone:
        again = f"{redone * step_s:.0f} s" if step_s else "step time unknown"
        text += f", {redone} step(s) trained again ({again})"
    cost = start.cost_s(step_s)
    return text + ("" if cost is None else f": cost {cost:.0f} s")


def start_lines(run_dir: Path, step_s: float | None = None) -> list[str]:
    """Every recorded start of the run (the newest :data:`MAX_SHOWN`), oldest first; [] when none."""
    starts = read_starts(run_dir)
    lines = [start_text(start, number, step_s) for number, start in enumerate(starts, 1)]
    if len(lines) > MAX_SHOWN:
        return [f"{len(lines) - MAX_SHOWN} earlier start(s) not shown", *lines[-MAX_SHOWN:]]
    return lines


def last_start(run_dir: Path) -> str | None:
    """The run's last recorded start, in words (its redone steps counted, not timed); None when none."""
    starts = read_starts(run_dir)
    return start_text(starts[-1], len(starts)) if starts else None
