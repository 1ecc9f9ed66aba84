"""One rank under ``launcher: torchrun``: what torchrun runs, ``python -m hpctrain.runtime.torchrun_worker STATE_DIR``.

The node task (torchrun_node.py) leaves the spec and the run directory in
``STATE_DIR/spec.json``. A worker is an ordinary hpctrain task
(``TaskLauncher``): its TaskEnv comes from torchrun's variables and the node
task's SLURM_* (task_env.py, source ``slurm-torchrun``), so it trains, stops,
requeues and resumes like an srun task. What differs is how its outcome
reaches submitit, which runs the node task and not this process:

* a result is pickled to ``STATE_DIR/result-RANK.pkl`` for the node task;
* ending without a result (the job was requeued: requeue.py) leaves
  ``STATE_DIR/exit-RANK``, so the node task ends without one too;
* an error exits non-zero (``PEER_FAILURE_EXIT`` when it looks like the echo
  of another rank's death), and global rank 0 reads the first failed rank
  from the run's ``torchrun-failures.log`` instead of srun's report;
* no reaper of its own: the node task's reaper covers every process of the
  node (one reaper per worker would kill the worker's siblings, which carry
  the same token).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from hpctrain.rundir import torchrun_failures_path
from hpctrain.runtime import failures
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.launcher import TaskLauncher
from hpctrain.runtime.torchrun_node import PEER_FAILURE_EXIT, SPEC_FILE


class TorchrunWorker(TaskLauncher):
    """``TaskLauncher`` for a process torchrun started; see the module docstring."""

    def __init__(self, spec_data: dict[str, Any], run_dir: str, state_dir: Path) -> None:
        super().__init__(spec_data, run_dir)
        self.state_dir = Path(state_dir)

    def step_log(self, env: TaskEnv) -> failures.StepLog | None:
        if not env.is_main:
            return None
        path = torchrun_failures_path(self.run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        return failures.StepLog(path)

    def exit_without_result(self, status: int) -> None:
        rank = getattr(self, "_env", None)
        (self.state_dir / f"exit-{rank.global_rank if rank else os.getpid()}").touch()
        super().exit_without_result(status)

    def start_reaper(self) -> None:
        """The node task's reaper covers this process (see the module docstring)."""

    def save_result(self, result: dict[str, Any]) -> None:
        path = self.state_dir / f"result-{result['rank']}.pkl"
        temp = path.with_suffix(".tmp")
        temp.write_bytes(pickle.dumps(result))
        os.replace(temp, path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {__spec__.name if __spec__ else 'torchrun_worker'} STATE_DIR", file=sys.stderr)
        return 2
    state_dir = Path(args[0])
    payload = json.loads((state_dir / SPEC_FILE).read_text())
    worker = TorchrunWorker(payload["spec"], payload["run_dir"], state_dir)
    try:
        result = worker()
    except Exception as exc:  # reported by the launcher already
        return PEER_FAILURE_EXIT if failures.looks_like_peer_failure(exc) else 1
    worker.save_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
