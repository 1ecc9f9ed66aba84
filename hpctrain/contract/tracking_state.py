"""A run's identity in experiment trackers and what ``hpctrain sync`` has sent there. Torch-free.

* The **tracking id** is chosen once, when the run is submitted, and kept in
  ``run.json`` (``tracking_id``): every start of the run (a requeue, a
  preemption, a relaunch after a lost node, ``hpctrain resume``) keeps
  run.json and so the id; each sweep trial and study point has a run.json,
  and so an id, of its own. It is the W&B run id and the MLflow run's
  ``hpctrain.tracking_id`` tag. A run submitted before trackers existed gets
  one on its first sync (``.hpctrain/tracking/id``, created exclusively).
* The **cursor** (``.hpctrain/tracking/TRACKER.json``) says what a tracker has
  acknowledged: the tracker's own run id, the last step sent, the events,
  parameters and artifacts sent. It is written atomically, and only after
  the tracker acknowledged what it records (``hpctrain/tracking/sync.py``).
  One sync at a time sends a run to a tracker: :func:`sync_lock` (``TRACKER.lock``,
  ``flock``) makes a second one (another terminal, a cron job) skip the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.file_writes import open_resumable, write_atomic
from hpctrain.contract.rundir import RUN_FILE, read_json_object, run_home, tracking_dir, write_json_atomic
from hpctrain.contract.runfiles import RunFileError, read_bounded
from hpctrain.errors import RunDirError

TRACKING_ID_KEY = "tracking_id"
ID_FILE = "id"
TRACKING_ID = re.compile(r"^[a-z0-9]{8,32}$")  # a W&B run id: letters and digits
TRACKERS = ("wandb", "mlflow")


def new_tracking_id() -> str:
    """A fresh tracking id: 16 lowercase hex digits."""
    return secrets.token_hex(8)


def tracking_id(run_dir: Path) -> str:
    """The run's tracking id: run.json's, else the one its first sync chose (created here, exclusively)."""
    info = read_json_object(Path(run_dir) / RUN_FILE, within=run_home(Path(run_dir))) or {}
    chosen = info.get(TRACKING_ID_KEY)
    if isinstance(chosen, str) and TRACKING_ID.match(chosen):
        return chosen
    path = tracking_dir(run_dir) / ID_FILE
    chosen = new_tracking_id()
    try:
        write_atomic(path, chosen + "\n", exclusive=True, mode=0o644)  # the first sync's choice stays
        return chosen
    except FileExistsError:
        pass
    try:
        found = read_bounded(path, 64, within=run_home(Path(run_dir))).decode(errors="replace").strip()
    except (OSError, RunFileError):
        found = ""
    if not TRACKING_ID.match(found):
        raise RunDirError(
            f"{path}: not a tracking id ({found[:40]!r})",
            hint="remove the file; the next 'hpctrain sync' starts a new tracker run for this run",
        )
    return found


@dataclass
class Cursor:
    """What one tracker has acknowledged for one run (all of it, or nothing: written atomically)."""

    tracker: str
    run_ref: str | None = None  # the tracker's own id of the run (MLflow's run id; W&B: the tracking id)
    sent_step: int = -1  # every step <= this has been sent with its final value
    sent_bytes: int = 0  # metrics.jsonl's length when sent_step was settled: later lines are new
    events: list[str] = field(default_factory=list)  # restarts, lost nodes, evictions sent (their keys)
    params: dict[str, str] = field(default_factory=dict)  # the spec's values as sent
    artifacts: list[str] = field(default_factory=list)  # "name:size:mtime" of report files sent
    final: str | None = None  # the run's final status once sent
    tags: dict[str, str] = field(default_factory=dict)  # the run's facts as last sent
    late_steps: list[int] = field(default_factory=list)  # steps redone after they were sent (see docs)


def cursor_path(run_dir: Path, tracker: str) -> Path:
    if tracker not in TRACKERS:
        raise ValueError(f"unknown tracker {tracker!r}")
    return tracking_dir(run_dir) / f"{tracker}.json"


def read_cursor(run_dir: Path, tracker: str) -> Cursor:
    """The tracker's cursor; a fresh one when there is none. A damaged one is an error (never a silent resend)."""
    path = cursor_path(run_dir, tracker)
    if not path.exists():
        return Cursor(tracker)
    data = read_json_object(path, within=run_home(Path(run_dir)))
    try:
        if data is None:
            raise TypeError("not a JSON object")
        cursor = Cursor(**{key: data[key] for key in Cursor.__dataclass_fields__ if key in data})
        if not isinstance(cursor.sent_step, int) or not isinstance(cursor.sent_bytes, int):
            raise TypeError("sent_step and sent_bytes must be whole numbers")
        if cursor.tracker != tracker:
            raise TypeError(f"it is {cursor.tracker!r}'s")
        return cursor
    except TypeError as exc:
        raise RunDirError(
            f"{path}: unreadable sync cursor ({exc})",
            hint="remove it: the next 'hpctrain sync' finds the tracker run by its hpctrain.tracking_id tag "
            "and sends the steps after the one the tracker has (MLflow), or writes the run again (W&B offline)",
        ) from None


def write_cursor(run_dir: Path, cursor: Cursor) -> None:
    """Record what the tracker acknowledged (atomically: a sync killed here leaves the old cursor)."""
    path = cursor_path(run_dir, cursor.tracker)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, cursor_fields(cursor))


def cursor_fields(cursor: Cursor) -> dict[str, Any]:
    return asdict(cursor)


@contextlib.contextmanager
def sync_lock(run_dir: Path, tracker: str) -> Iterator[bool]:
    """Hold the run's sync lock for ``tracker`` while the block runs: True, or False when another sync has it."""
    path = cursor_path(run_dir, tracker).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_resumable(path)  # created if missing, never through a symlink
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock
