"""Waiting for submitted jobs: a local run followed in the foreground, a Slurm job waited for.

A local run (``submit --local``, ``hpctrain.submit(job, local=True, wait=True)``)
runs under this process: its rank 0 log is echoed while it runs, and SIGTERM
or SIGHUP (a closed terminal, ``kill``, a session manager) stops the whole
run, as ``hpctrain cancel`` would, before this process goes on. Torch-free.
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

from hpctrain.contract.rundir import Summary, read_summary, run_home
from hpctrain.contract.runfiles import copy_out
from hpctrain.contract.slurm_states import succeeded
from hpctrain.errors import ClusterError
from hpctrain.launch.submission import SubmittedRun

TERMINATIONS = (signal.SIGTERM, signal.SIGHUP)
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
    except KeyboardInterrupt:
        for j in submitted.jobs:
            j.cancel(check=False)
        print(
            f"\ncancelled; the run directory {submitted.run_dir} keeps its last checkpoint "
            f"('hpctrain resume {submitted.run_dir} --local' continues it)",
            file=sys.stderr,
        )
        return 130
    except _Terminated as exc:
        print(f"\n{exc.name}: stopping the run's processes (up to {LOCAL_STOP_TIMEOUT_S:.0f} s)", file=sys.stderr)
        with _terminations_ignored():  # a second SIGTERM must not cut the stop short
            stop_local(submitted, LOCAL_STOP_TIMEOUT_S)
        print(
            f"stopped; the run directory {submitted.run_dir} keeps its last checkpoint "
            f"('hpctrain resume {submitted.run_dir} --local' continues it)",
            file=sys.stderr,
        )
        return 128 + exc.signum
    failures = [j for j in submitted.jobs if j.exception() is not None]
    summary = read_summary(submitted.trial_dirs[0]) or Summary()
    if failures:
        error = str(failures[0].exception()).strip().splitlines()
        tail = "\n".join(error[-8:])
        raise ClusterError(f"local job failed:\n{tail}", hint=f"full logs: hpctrain logs {submitted.run_dir} --err")
    status = summary.status or "completed"
    line = f"finished: status {status}"
    for key in ("epochs_completed", "val_top1", "val_top5", "wall_s"):
        value = getattr(summary, key)
        if value is not None:
            line += f", {key} {value:.2f}" if isinstance(value, float) else f", {key} {value}"
    print(line, file=stream)
    print(f"run dir: {submitted.run_dir}", file=stream)
    return 0 if status in ("completed", "running") else 1


def stop_local(submitted: SubmittedRun, timeout_s: float) -> None:
    """Cancel a local submission from inside: cancel markers first (the tasks then save and stop rather
    than take the SIGTERM for a preemption), then every controller and whatever carries its run token."""
    from hpctrain.runtime import local_run
    from hpctrain.runtime.stop import write_cancel_marker

    records = [r for j in submitted.jobs if (r := getattr(j, "local_process", None)) is not None]
    for one_dir, one in zip(submitted.trial_dirs, submitted.jobs):
        write_cancel_marker(one_dir, [one.job_id])
    local_run.stop(records, timeout_s)


def wait_for_job(submitted: SubmittedRun) -> str:
    """Block until Slurm says the job ended; its final state."""
    from hpctrain.contract.slurm import wait_until_done

    return wait_until_done(submitted.job_id)


def wait_slurm(submitted: SubmittedRun, *, quiet: bool) -> int:
    """Wait for a Slurm job and say how it ended; 0 when it completed, else 1 (with where its logs are).

    A run that completed counts as such whatever Slurm's word: a job preempted in its last seconds
    ends PREEMPTED on Slurm 24.05+ (hpctrain keeps it from starting again, docs/preemption.md).
    """
    state = wait_for_job(submitted)
    if not quiet:
        print(f"job {submitted.job_id} ended: {state}")
    if not succeeded(state) and run_completed(submitted):
        if not quiet:
            print(f"the run completed; Slurm ended the job {state} (a preemption reached it in its last seconds)")
        return 0
    if not succeeded(state):
        print(
            f"error: job {submitted.job_id} ended {state}; see hpctrain logs {submitted.run_dir} --err", file=sys.stderr
        )
        return 1
    return 0


def run_completed(submitted: SubmittedRun) -> bool:
    """Whether every trial's summary.json says the run completed."""
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


def _terminations_ignored() -> contextlib.AbstractContextManager[None]:
    return _handling(TERMINATIONS, signal.SIG_IGN)


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
