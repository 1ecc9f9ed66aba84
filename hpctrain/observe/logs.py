"""A run's task logs: where they are, their tail, and following them until the job ends.

Logs are read from their end and then in blocks, never whole, so a log of
gigabytes costs what is printed; only regular files inside the run directory
are read (``contract.rundir.task_log_path``), and not through a symlink that
leads out of it (``RUN/submitit -> /elsewhere``). Torch-free.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TextIO

from hpctrain.contract.rundir import read_run_info, run_home, task_log_path
from hpctrain.contract.runfiles import copy_out, tail_lines
from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_states import is_final
from hpctrain.contract.summary import read_summary
from hpctrain.errors import RunDirError
from hpctrain.launch import local_run

FOLLOW_POLL_S = 1.0


def log_path(run_dir: Path, rank: int, err: bool) -> Path:
    return task_log_path(run_dir, read_run_info(run_dir), rank, err=err)


def check_rank(rank: int, info: dict[str, Any]) -> None:
    """A rank the job does not have is a mistake, not a pending job. ``tasks``: the Slurm tasks, one log each
    (one per node under torchrun or for a script per node); older runs recorded only ``world_size``."""
    tasks = info.get("tasks", info.get("world_size"))
    if isinstance(tasks, int) and rank >= tasks:
        per_node = isinstance(info.get("world_size"), int) and tasks < info["world_size"]
        what = f"{tasks} task{'s' if tasks != 1 else ''}" + (", one log per node" if per_node else "")
        raise RunDirError(f"--rank {rank}: this job has {what}", hint=f"use --rank 0 to {tasks - 1}")


def write_tail(path: Path, lines: int, out: TextIO, *, within: Path | None = None) -> int:
    """Write the last ``lines`` lines (0: all, streamed) to ``out``; the offset to follow from. ``within``:
    the run's home, which the log may not lead out of (``runfiles.open_regular``)."""
    if lines == 0:
        return copy_out(path, 0, out, within=within)
    try:
        data, size = tail_lines(path, lines, within=within)
    except FileNotFoundError:
        return 0
    out.write(data.decode("utf-8", errors="replace"))
    out.flush()
    return size


def follow(path: Path, offset: int, run_dir: Path, info: dict[str, Any], out: TextIO) -> None:
    """Write what the log gains until the job will write no more (then once more, for its last lines)."""
    home = run_home(run_dir)
    while True:
        offset = copy_out(path, offset, out, within=home)  # in blocks, regular files inside the run only
        if job_writes_no_more(run_dir, info):
            copy_out(path, offset, out, within=home)
            return
        time.sleep(FOLLOW_POLL_S)


def job_writes_no_more(run_dir: Path, info: dict[str, Any]) -> bool:
    """Whether the job will write no more: Slurm says it ended; a local run's summary is final or its
    controller is provably gone (``launch/local_run.py``: the PID alone proves nothing)."""
    if info.get("backend") != "local":
        return is_final(Slurm().job_state(str(info.get("job_id") or "")))
    summary = read_summary(run_dir)
    return (summary is not None and summary.is_final) or local_run.liveness(info, run_dir) == "gone"
