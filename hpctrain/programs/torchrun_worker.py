"""One rank under ``launcher: torchrun``: what torchrun runs, ``python -m hpctrain.programs.torchrun_worker STATE_DIR``.

The node task (torchrun_node.py) leaves the spec and the run directory in
``STATE_DIR/spec.json``. A worker is an ordinary hpctrain task
(``TaskLauncher``): its TaskEnv comes from torchrun's variables and the node
task's SLURM_* (task_env.py, source ``slurm-torchrun``), so it trains, stops,
requeues and resumes like an srun task. What differs is how its outcome
reaches submitit, which runs the node task and not this process:

* a result is pickled to ``STATE_DIR/result-RANK.pkl`` for the node task;
* ending without a result (the job was requeued: requeue.py) leaves
  ``STATE_DIR/exit-RANK``, so the node task ends without one too;
* an error leaves ``STATE_DIR/failed-RANK`` (what was raised, or "peer"
  when it looks like the echo of another rank's death) and exits non-zero;
  global rank 0 reads the first failed rank from the run's
  ``torchrun-failures.log`` (written by the node tasks) instead of srun's report;
* no reaper of its own: the node task's reaper covers every process of the
  node (one reaper per worker would kill the worker's siblings, which carry
  the same token);
* no ``tracking.live`` sender of its own, not even global rank 0: the node
  task that hosts rank 0 starts it (torchrun ends a worker's whole process
  group when it tears the workers down, and it must be one per run).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import torchrun_failures_path
from hpctrain.jobspec.models import JobSpec
from hpctrain.programs.launcher import TaskLauncher
from hpctrain.programs.torchrun_node import PEER_FAILURE, PEER_FAILURE_EXIT, SPEC_FILE, write_failure, write_result
from hpctrain.runtime import failures
from hpctrain.runtime.context import TaskEnv


class TorchrunWorker(TaskLauncher):
    """``TaskLauncher`` for a process torchrun started; see the module docstring."""

    def __init__(self, spec_data: dict[str, Any], run_dir: str, state_dir: Path, code_root: str | None = None) -> None:
        super().__init__(spec_data, run_dir, code_root)
        self.state_dir = Path(state_dir)

    def step_log(self, env: TaskEnv) -> failures.StepLog | None:
        return failures_log(self.run_dir, env)

    def exit_without_result(self, status: int) -> None:
        rank = getattr(self, "_env", None)
        (self.state_dir / f"exit-{rank.global_rank if rank else os.getpid()}").touch()
        super().exit_without_result(status)

    def start_reaper(self) -> None:
        """The node task's reaper covers this process (see the module docstring)."""

    def start_tracker_sender(self, spec: JobSpec, env: TaskEnv) -> None:
        """The node task that hosts global rank 0 starts it (see the module docstring)."""


def failures_log(run_dir: str | Path, env: TaskEnv) -> failures.StepLog | None:
    """Global rank 0's report of failed ranks: the node tasks write them to ``torchrun-failures.log``."""
    if not env.is_main:
        return None
    path = torchrun_failures_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    return failures.StepLog(path)


def failure_exit(exc: Exception, state_dir: Path) -> int:
    """Tell the node task why this rank is about to exit (torchrun_node.death_reason); the exit status."""
    peer = failures.looks_like_peer_failure(exc)
    write_failure(state_dir, PEER_FAILURE if peer else f"{type(exc).__name__}: {exc}")
    return PEER_FAILURE_EXIT if peer else 1


def run_worker(
    argv: list[str] | None,
    module: str,
    make: Callable[[dict[str, Any], Path], Callable[[], dict[str, Any]]],
    failed: Callable[[Exception, Path], int] = failure_exit,
) -> int:
    """A rank's process, ``python -m MODULE STATE_DIR``: the worker ``make`` builds from the node task's
    payload runs; its result, or what it raised, is left in STATE_DIR for the node task. ``failed`` turns
    an exception into the exit status."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {module} STATE_DIR", file=sys.stderr)
        return 2
    state_dir = Path(args[0])
    worker = make(json.loads((state_dir / SPEC_FILE).read_text()), state_dir)
    try:
        result = worker()
    except Exception as exc:  # reported by the launcher already; the marker is for the node task
        return failed(exc, state_dir)
    write_result(state_dir, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_worker(
        argv,
        __spec__.name if __spec__ else "torchrun_worker",
        lambda payload, state_dir: TorchrunWorker(
            payload["spec"], payload["run_dir"], state_dir, payload.get("code_root")
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
