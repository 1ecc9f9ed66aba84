"""``launcher: torchrun`` for a ``script:`` job: torchrun on every node, each rank's program the script's wrapper.

The node task is the trainer's (``programs/torchrun_node.py``: one Slurm task
per node, the c10d rendezvous on the first node, ``--max-restarts 0``, stop
signals forwarded to torchrun's children, the node's reaper, the first failed
rank reported to ``torchrun-failures.log``). Each rank torchrun starts is
``python -m hpctrain.programs.script_torchrun STATE_DIR``: a
:class:`ScriptTorchrunWorker`, the same wrapper as under srun
(``programs/script_launcher.py``), which runs the user's script with torchrun's
environment (``RANK``, ``LOCAL_RANK``, ``TORCHELASTIC_*``...) and hpctrain's,
stops it, and records how it failed. So a script under torchrun gets what it
gets under srun: its own stop signal and grace, the failed rank named with its
exit code and last lines, requeue and resume.

torchrun runs with ``--tee 3``: each rank's output goes to the node's log with
a ``[default0]:`` prefix (the ranks of a node share one log) and to a file of
its own, so a failed rank's last lines are its own. Importing this imports no torch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hpctrain.jobspec.models import JobSpec
from hpctrain.programs.script_launcher import ScriptLauncher
from hpctrain.programs.torchrun_node import (
    PEER_FAILURE,
    PEER_FAILURE_EXIT,
    TorchrunNodeLauncher,
    write_failure,
)
from hpctrain.programs.torchrun_worker import failure_exit, failures_log, run_worker
from hpctrain.runtime import failures
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.script.outcome import PeerFailed, ScriptExit, ScriptFailed

SCRIPT_WORKER_MODULE = "hpctrain.programs.script_torchrun"
TEE_ALL = "--tee=3"  # stdout and stderr: to the node's log (prefixed) and to a file per rank


class ScriptTorchrunNode(TorchrunNodeLauncher):
    """The node task of a script job under torchrun: torchrun's program is each rank's script wrapper."""

    worker_module = SCRIPT_WORKER_MODULE
    torchrun_options = (TEE_ALL,)

    def __init__(
        self, spec_data: dict[str, Any], run_dir: str, code: dict[str, Any], preempt_grace_s: float | None = None
    ) -> None:
        super().__init__(spec_data, run_dir, None)
        self.code, self.preempt_grace_s = code, preempt_grace_s

    def worker_payload(self) -> dict[str, Any]:
        return {**super().worker_payload(), "script_code": self.code, "preempt_grace_s": self.preempt_grace_s}


class ScriptTorchrunWorker(ScriptLauncher):
    """One rank under torchrun: the script wrapper, reporting to its node task as the trainer's ranks do."""

    def __init__(
        self,
        spec_data: dict[str, Any],
        run_dir: str,
        code: dict[str, Any],
        preempt_grace_s: float | None,
        state_dir: Path,
    ) -> None:
        super().__init__(spec_data, run_dir, code, preempt_grace_s)
        self.state_dir = Path(state_dir)

    def step_log(self, env: TaskEnv) -> failures.StepLog | None:
        """The node tasks report failed ranks to ``torchrun-failures.log`` (global rank 0 reads it)."""
        return failures_log(self.run_dir, env)

    def start_reaper(self) -> None:
        """The node task's reaper covers this rank and its script (they carry the node task's token)."""

    def start_tracker_sender(self, spec: JobSpec, env: TaskEnv) -> None:
        """The node task that hosts global rank 0 starts ``tracking.live``'s sender (torchrun_node.py)."""

    def exit_without_result(self, status: int) -> None:
        env = getattr(self, "_env", None)
        rank = os.environ.get("RANK", str(os.getpid())) if env is None else str(env.global_rank)
        (self.state_dir / f"exit-{rank}").touch()
        super().exit_without_result(status)

    def save_failure_marker(self, own: ScriptExit) -> None:
        """Tell the node task why this rank ends (torchrun_node.death_reason): its line in srun's words."""
        write_failure(self.state_dir, PEER_FAILURE if own.peer else f"the script {own.reason}")


def main(argv: list[str] | None = None) -> int:
    return run_worker(
        argv,
        SCRIPT_WORKER_MODULE,
        lambda payload, state_dir: ScriptTorchrunWorker(
            payload["spec"], payload["run_dir"], payload["script_code"], payload.get("preempt_grace_s"), state_dir
        ),
        _failure_exit,
    )


def _failure_exit(exc: Exception, state_dir: Path) -> int:
    if isinstance(exc, PeerFailed):  # another rank failed first: this one's end is nobody's first failure
        write_failure(state_dir, PEER_FAILURE)
        return PEER_FAILURE_EXIT
    if isinstance(exc, ScriptFailed):  # its marker is written (save_failure_marker)
        return 1
    return failure_exit(exc, state_dir)


if __name__ == "__main__":
    sys.exit(main())
