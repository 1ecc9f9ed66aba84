"""``hpctrain logs RUN``: print or follow one task's stdout/stderr of a run's latest job.

The log is read from its end (``-n`` lines) and then in blocks, never whole,
so a log of gigabytes costs what is printed. It is looked for inside the run
directory only: run.json's ``submitit_dir`` is followed when it lies there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hpctrain.cli.tail import echo_new
from hpctrain.contract import job_registry
from hpctrain.contract.rundir import read_run_info, read_summary, submitit_dir_ignored, task_log_path
from hpctrain.contract.runfiles import copy_out, printable, tail_lines
from hpctrain.contract.slurm import is_final, job_state
from hpctrain.errors import RunDirError
from hpctrain.runtime import local_run

FOLLOW_POLL_S = 1.0


def log_path(run_dir: Path, rank: int, err: bool) -> Path:
    return task_log_path(run_dir, read_run_info(run_dir), rank, err=err)


def run(args: argparse.Namespace) -> int:
    run_dir = job_registry.resolve_run(args.run)
    info = read_run_info(run_dir)
    path = task_log_path(run_dir, info, args.rank, err=args.err)
    _check_rank(args.rank, info)
    ignored = submitit_dir_ignored(run_dir, info)
    if ignored is not None:
        print(
            f"note: run.json's submitit_dir {printable(ignored)} is outside this run directory; "
            f"reading {path.parent} instead",
            file=sys.stderr,
        )
    if not path.exists() and not args.follow:
        raise RunDirError(f"no log yet at {path}", hint="the job may still be pending: hpctrain status " + args.run)
    offset = _print_tail(path, args.lines)
    if not args.follow:
        return 0
    while True:
        offset = echo_new(path, offset, sys.stdout)
        if _ended(run_dir, info):
            echo_new(path, offset, sys.stdout)
            return 0
        time.sleep(FOLLOW_POLL_S)


def _ended(run_dir: Path, info: dict) -> bool:
    """Whether the job will write no more: Slurm says it ended; a local run's summary is final or its
    controller is provably gone (``runtime.local_run``: the PID alone proves nothing)."""
    if info.get("backend") != "local":
        return is_final(job_state(str(info.get("job_id") or "")))
    summary = read_summary(run_dir)
    return (summary is not None and summary.is_final) or local_run.liveness(info) == "gone"


def _check_rank(rank: int, info: dict) -> None:
    """A rank the job does not have is a mistake, not a pending job."""
    world = info.get("world_size")  # absent in runs submitted before run.json recorded it
    if isinstance(world, int) and rank >= world:
        raise RunDirError(
            f"--rank {rank}: this job has {world} task{'s' if world != 1 else ''}", hint=f"use --rank 0 to {world - 1}"
        )


def _print_tail(path: Path, lines: int) -> int:
    """Print the last ``lines`` lines (0: all, streamed); the offset to follow from."""
    if lines == 0:
        return copy_out(path, 0, sys.stdout)
    try:
        data, size = tail_lines(path, lines)
    except FileNotFoundError:
        return 0
    sys.stdout.write(data.decode("utf-8", errors="replace"))
    sys.stdout.flush()
    return size
