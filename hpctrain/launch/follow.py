"""Waiting for submitted jobs: a local run followed in the foreground, a Slurm job waited for.

A local run (``submit --local``, ``hpctrain.submit(job, local=True, wait=True)``)
runs under this process: its rank 0 log is echoed while it runs, and Ctrl-C,
SIGTERM or SIGHUP (a closed terminal, ``kill``, a session manager) stops the
whole run, as ``hpctrain cancel`` would (the tasks save first), before this
process goes on. Every one of them ends the same way: the run's status is
``stopped``, and one line says what it kept and how to resume
(:func:`what_it_kept`). The run's controller leads its own process group, so a
terminal's Ctrl-C reaches this process alone. Torch-free.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from hpctrain.contract.checkpoint_listing import latest_checkpoint_step
from hpctrain.contract.rundir import run_home
from hpctrain.contract.runfiles import copy_out
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.errors import ClusterError
from hpctrain.launch.submission import SubmittedRun

TERMINATIONS = (signal.SIGTERM, signal.SIGHUP)
STOPS = (signal.SIGINT, *TERMINATIONS)  # ignored while the run is being stopped
LOCAL_STOP_TIMEOUT_S = 60.0  # as 'hpctrain cancel --timeout': time for the tasks to write their stop checkpoint


def follow_local(submitted: SubmittedRun, stream: TextIO) -> int:
    """Run a local job in the foreground, echoing rank 0's log to ``stream``; the exit code of its status
    (0 completed, 1 otherwise, 130 on Ctrl-C, 128 + the signal when terminated).

    Raises ``ClusterError`` when the job itself failed (its last lines, and where its logs are).
    """
    job = submitted.jobs[0]
    log_path = Path(str(job.paths.stdout).replace("%t", "0"))
    offset = 0
    try:
        with _terminations_raise():
            while True:
                done = all(j.done() for j in submitted.jobs)
                # in blocks, regular files inside the run only
                offset = copy_out(log_path, offset, stream, within=run_home(submitted.run_dir))
                if done:
                    break
                time.sleep(0.5)
    except (KeyboardInterrupt, _Terminated) as exc:
        signum = exc.signum if isinstance(exc, _Terminated) else signal.SIGINT
        print(
            f"\n{stop_name(signum)}: stopping the run's processes; they save a checkpoint first "
            f"(up to {LOCAL_STOP_TIMEOUT_S:.0f} s)",
            file=sys.stderr,
        )
        with _stops_ignored():  # a second Ctrl-C or SIGTERM must not cut the stop short
            stop_local(submitted, LOCAL_STOP_TIMEOUT_S)
        return 128 + signum  # the caller says what became of the run (launch/submit.py: RunStopped)
    failures = [j for j in submitted.jobs if j.exception() is not None]
    summary = read_summary(submitted.trial_dirs[0]) or Summary()
    if failures:
        error = str(failures[0].exception()).strip().splitlines()
        tail = "\n".join(error[-8:])
        raise ClusterError(f"local job failed:\n{tail}", hint=f"full logs: hpctrain logs {submitted.run_dir} --err")
    status = local_status(submitted)
    line = f"finished: status {status}"
    for key in ("epochs_completed", "val_top1", "val_top5", "wall_s"):
        value = getattr(summary, key)
        if value is not None:
            line += f", {key} {value:.2f}" if isinstance(value, float) else f", {key} {value}"
    print(line, file=stream)
    print(f"run dir: {submitted.run_dir}", file=stream)
    return 0 if status in ("completed", "running") else 1


def stop_name(signum: int) -> str:
    """How a stop is named to the user: ``Ctrl-C`` for SIGINT, else the signal's name."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def what_it_kept(run_dir: Path) -> str:
    """What a stopped run kept, in the words every stop uses: its last checkpoint's step, or none."""
    step = latest_checkpoint_step(run_dir)
    if step is not None:
        return f"it saved a checkpoint at step {step}"
    script = ((read_summary(run_dir) or Summary()).model_extra or {}).get("script")
    if isinstance(script, str):
        return "hpctrain saw no checkpoint of it (a script keeps its own, if it saves any)"
    return "it had saved no checkpoint yet (resuming starts it from the beginning)"


def local_status(submitted: SubmittedRun) -> str:
    """How a local run that was followed to its end ended: its summary's status."""
    return (read_summary(submitted.trial_dirs[0]) or Summary()).status or "completed"


def stop_local(submitted: SubmittedRun, timeout_s: float) -> None:
    """Cancel a local submission from inside: cancel markers first (the tasks then save and stop rather
    than take the SIGTERM for a preemption), then every controller and whatever carries its run token."""
    from hpctrain.contract.cancel_marker import write_cancel_marker
    from hpctrain.launch import local_run

    records = [r for j in submitted.jobs if (r := getattr(j, "local_process", None)) is not None]
    for one_dir, one in zip(submitted.trial_dirs, submitted.jobs):
        write_cancel_marker(one_dir, [one.job_id])
    local_run.stop(records, timeout_s)


def wait_for_job(submitted: SubmittedRun, slurm: Slurm | None = None) -> str:
    """Block until Slurm says the job ended; its final state."""
    return (slurm or Slurm()).wait_for(submitted.job_id)


def run_completed(submitted: SubmittedRun) -> bool:
    """Whether every trial's summary.json says the run completed: a run that did counts as such whatever
    Slurm called the job's end (Slurm 24.05+: PREEMPTED when a preemption reached it in its last seconds;
    hpctrain keeps it from starting again, docs/preemption.md)."""
    summaries = [read_summary(one) for one in submitted.trial_dirs]
    return bool(summaries) and all(summary is not None and summary.status == "completed" for summary in summaries)


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _terminations_raise() -> contextlib.AbstractContextManager[None]:
    """SIGTERM and SIGHUP raise :class:`_Terminated` in the main thread (the first one: the next ones
    are ignored until the block is left); the previous handlers are back afterwards."""

    def handler(signum: int, _frame: object) -> None:
        for one in TERMINATIONS:
            signal.signal(one, signal.SIG_IGN)
        raise _Terminated(signum)

    return _handling(TERMINATIONS, handler)


def _stops_ignored() -> contextlib.AbstractContextManager[None]:
    return _handling(STOPS, signal.SIG_IGN)


@contextlib.contextmanager
def _handling(signums: tuple[signal.Signals, ...], handler: object) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (the Python API called from a worker thread)
        return
    previous = {one: signal.signal(one, handler) for one in signums}  # type: ignore[arg-type]
    try:
        yield
    finally:
        for one, old in previous.items():
            signal.signal(one, old)
