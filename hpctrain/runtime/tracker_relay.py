"""Global rank 0 starts the run's live tracker sender (``tracking.live``) beside the training, never inside it.

The task side never imports the tracking wing (tests/unit/test_house_layering.py):
this module only starts ``python -m hpctrain.tracking.live RUN_DIR`` as a
child process that ends with the task (``contract/child_process.py``: the
parent's death signal, SIGTERM, after which it makes one bounded last sync).
Its output goes to ``RUN/.hpctrain/tracking/live.log``. A sender that cannot
start is a warning on stderr, never a failed task.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.contract.child_process import start_child
from hpctrain.contract.file_writes import open_append
from hpctrain.contract.rundir import tracking_dir

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

LIVE_MODULE = "hpctrain.tracking.live"
LIVE_LOG = "live.log"


def live_sender_argv(spec: JobSpec, run_dir: str | Path, *, is_main: bool) -> list[str] | None:
    """The sender's command line, or None where there is none to start (not rank 0, ``tracking.live`` off)."""
    if not is_main or not spec.tracking.live or not spec.tracking.trackers:
        return None
    return [sys.executable, "-m", LIVE_MODULE, str(run_dir), "--interval", f"{spec.tracking.live_interval_s:g}"]


def start_live_sender(spec: JobSpec, run_dir: str | Path, *, is_main: bool) -> subprocess.Popen | None:
    """Start the sender (see the module docstring); None when not asked for or when it could not start."""
    argv = live_sender_argv(spec, run_dir, is_main=is_main)
    if argv is None:
        return None
    try:
        folder = tracking_dir(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        log = open_append(folder / LIVE_LOG)
        try:
            return start_child(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        finally:
            os.close(log)  # the child has its own copy
    except OSError as exc:
        print(f"hpctrain: warning: tracking.live: the sender did not start ({exc}); 'hpctrain sync RUN' sends "
              "the run from where you run it", file=sys.stderr)  # fmt: skip
        return None
