"""The run's live tracker sender (``tracking.live``): started beside the training, never inside it.

The task side never imports the tracking wing (tests/unit/test_house_layering.py):
this module only starts ``python -m hpctrain.tracking.live RUN_DIR`` as a
child process that ends with the task (``contract/child_process.py``: the
parent's death signal, SIGTERM, after which it makes one bounded last sync).
Its output goes to ``RUN/.hpctrain/tracking/live.log``. A sender that cannot
start is a warning on stderr, never a failed task.

Who starts it: one process per start of the job, on the node of global rank 0.
Under hpctrain's own launcher that is global rank 0's task
(``programs/launcher.py``); under ``launcher: torchrun`` the node task whose
torchrun started global rank 0 (``programs/torchrun_node.py``): the workers are
torchrun's, which ends each one's whole process group when it tears them down,
and torchrun's rendezvous, not Slurm, decides which node gets rank 0, so the
node task starts it once it sees its worker of rank 0, and ends it with
:func:`stop_live_sender` when torchrun is done: when the run ended for good it
first says so on the sender's stdin (the line ``ended``; inside the job Slurm
calls the job RUNNING, so only the task can tell the sender that the run's end
may go to the tracker).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.contract.child_process import start_child
from hpctrain.contract.file_writes import open_append
from hpctrain.contract.rundir import tracking_dir

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

LIVE_MODULE = "hpctrain.tracking.live"
ENDED_LINE = b"ended\n"  # tracking/live.py's ENDED_LINE (the task side never imports that wing)
LIVE_LOG = "live.log"
# How long a node task waits for the sender's last sync after a run that ended for good: the sender bounds that
# sync itself (tracking/live.py's LAST_SYNC_S, 30 s); this is its bound and the time to exit.
LAST_SYNC_WAIT_S = 35.0


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
            return start_kept(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        finally:
            os.close(log)  # the child has its own copy
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"hpctrain: warning: tracking.live: the sender did not start ({exc}); 'hpctrain sync RUN' sends "
              "the run from where you run it", file=sys.stderr)  # fmt: skip
        return None


def start_kept(argv: list[str], **popen: Any) -> subprocess.Popen:
    """:func:`start_child` from a thread that lives as long as the child (it waits for it).

    The parent's death signal (``PR_SET_PDEATHSIG``) fires when the *thread* that started the child
    ends, not the process: under torchrun the node task hears of rank 0's start in its worker watch
    thread, which ends when torchrun does, so the sender got SIGTERM then, before the node task could
    tell it that the run ended (found on the Slurm test cluster: the MLflow run stayed RUNNING).
    """
    started: list[subprocess.Popen | BaseException] = []
    ready = threading.Event()

    def keep() -> None:
        try:
            started.append(start_child(argv, **popen))
        except BaseException as exc:  # handed to the caller's thread
            started.append(exc)
        ready.set()
        if isinstance(started[0], subprocess.Popen):
            started[0].wait()  # this thread ends with the child, never before

    threading.Thread(target=keep, name="hpctrain-live-sender", daemon=True).start()
    ready.wait()
    if isinstance(started[0], BaseException):
        raise started[0]
    return started[0]


def stop_live_sender(sender: subprocess.Popen | None, *, wait_s: float = 0.0, ended: bool = False) -> None:
    """End the sender, after which it makes one last sync bounded by its own clock. ``ended``: the run ended
    for good (every rank returned), said on its stdin, so that sync sends the run's end too; else SIGTERM.
    ``wait_s``: wait that long for it (the run ended for good: its last steps are settled now), then kill it;
    0: do not wait (a requeue or a failure ends the task at once; the parent's death signal and the reaper are
    the backstop).
    """
    if sender is None or sender.poll() is not None:
        return
    try:
        if not (ended and _say_ended(sender)):
            sender.terminate()
        if wait_s > 0:
            sender.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        sender.kill()
        sender.wait()
    except OSError:
        pass  # gone meanwhile


def _say_ended(sender: subprocess.Popen) -> bool:
    """Tell the sender that the run ended for good; False where it cannot hear it (no stdin, gone)."""
    if sender.stdin is None:
        return False
    if sender.stdin.closed:
        return True  # said already
    try:
        sender.stdin.write(ENDED_LINE)
        sender.stdin.close()
    except OSError:  # BrokenPipeError: it ended meanwhile
        return False
    return True
