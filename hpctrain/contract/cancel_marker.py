"""``hpctrain cancel``'s marker: ``.hpctrain/cancel-requested``, its payload and who obeys it. Torch-free.

Slurm sends the same SIGTERM for a preemption, a plain ``scancel`` and a job
past its time limit. ``hpctrain cancel`` writes this marker *before* it calls
``scancel``; a task that gets SIGTERM while a marker naming its job exists
stops for good instead of requeueing (``runtime/stop.py``). The payload is
``{"job_ids": [...], "time": ..., "pid": ...}``; no job ids means the whole run.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from pathlib import Path

from hpctrain.contract.rundir import atomic_write_text, cancel_marker_path
from hpctrain.contract.runfiles import OutsideRunError, RunFileError, load_json, read_bounded

MARKER_MAX_BYTES = 64 << 10  # the marker names a few job ids

cancel_marker = cancel_marker_path  # where ``hpctrain cancel`` leaves its marker (rundir owns the layout)


def cancel_marker_paths(run_dir: str | Path) -> tuple[Path, ...]:
    """The markers a task of ``run_dir`` obeys: its own and its parent's.

    A sweep trial runs in ``SWEEP_DIR/trial-NNN``; cancelling the sweep writes
    one marker in ``SWEEP_DIR``. Markers name job ids, so a parent marker for
    another job never applies.
    """
    run_dir = Path(run_dir)
    return (cancel_marker(run_dir), cancel_marker(run_dir.parent))


def write_cancel_marker(run_dir: str | Path, job_ids: Collection[str] = ()) -> Path:
    """Record that the user cancels ``job_ids`` (all jobs of the run if empty).

    Call this *before* ``scancel``: the tasks read it when SIGTERM arrives.
    """
    path = cancel_marker(run_dir)
    payload = {"job_ids": sorted(str(j) for j in job_ids), "time": time.time(), "pid": os.getpid()}
    atomic_write_text(path, json.dumps(payload) + "\n")
    return path


def clear_cancel_marker(run_dir: str | Path) -> None:
    """Forget an earlier cancel (``hpctrain resume`` calls this before resubmitting)."""
    cancel_marker(run_dir).unlink(missing_ok=True)


def marker_applies(path: Path, job_ids: Collection[str]) -> bool:
    """Whether the marker at ``path`` exists and names one of ``job_ids``.

    A marker without job ids (or one we cannot parse: it exists, so someone
    meant to cancel) applies to every job.
    """
    try:
        text = read_bounded(path, MARKER_MAX_BYTES, within=Path(path).parent.parent)  # RUN/.hpctrain/NAME
    except (OSError, OutsideRunError):  # a marker a symlink leads to is not in this run
        return False
    except RunFileError:
        return True  # it exists, so someone meant to cancel; a FIFO or a huge file is not read
    try:
        named = {str(j) for j in load_json(text).get("job_ids", [])}
    except (ValueError, AttributeError, TypeError):
        return True
    return not named or bool(named & {str(j) for j in job_ids})
