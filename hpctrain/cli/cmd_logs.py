"""``hpctrain logs RUN``: print or follow one task's stdout/stderr of a run's latest job."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hpctrain import job_registry
from hpctrain.cli.tail import echo_new
from hpctrain.errors import RunDirError
from hpctrain.rundir import read_run_info, task_log_path
from hpctrain.slurm import TERMINAL_STATES, job_state


def log_path(run_dir: Path, rank: int, err: bool) -> Path:
    return task_log_path(run_dir, read_run_info(run_dir), rank, err=err)


def run(args: argparse.Namespace) -> int:
    run_dir = job_registry.resolve_run(args.run)
    info = read_run_info(run_dir)
    path = task_log_path(run_dir, info, args.rank, err=args.err)
    _check_rank(args.rank, info)
    if not path.exists() and not args.follow:
        raise RunDirError(f"no log yet at {path}", hint="the job may still be pending: hpctrain status " + args.run)
    offset = _print_tail(path, args.lines)
    if not args.follow:
        return 0
    while True:
        offset = echo_new(path, offset, sys.stdout)
        done = info.get("backend") == "local" or job_state(info["job_id"]) in TERMINAL_STATES
        if done:
            echo_new(path, offset, sys.stdout)
            return 0
        time.sleep(1.0)


def _check_rank(rank: int, info: dict) -> None:
    """A rank the job does not have is a mistake, not a pending job."""
    world = info.get("world_size")  # absent in runs submitted before run.json recorded it
    if isinstance(world, int) and rank >= world:
        raise RunDirError(
            f"--rank {rank}: this job has {world} task{'s' if world != 1 else ''}", hint=f"use --rank 0 to {world - 1}"
        )


def _print_tail(path: Path, lines: int) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    text = data.decode("utf-8", errors="replace")
    chunk = text if lines == 0 else "\n".join(text.splitlines()[-lines:]) + ("\n" if text.endswith("\n") else "")
    sys.stdout.write(chunk)
    sys.stdout.flush()
    return len(data)
