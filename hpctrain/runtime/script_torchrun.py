"""``launcher: torchrun`` for a ``script:`` job: torchrun on every node, each rank's program the script's wrapper.

The node task is the trainer's (``runtime/torchrun_node.py``: one Slurm task
per node, the c10d rendezvous on the first node, ``--max-restarts 0``, stop
signals forwarded to torchrun's children, the node's reaper, the first failed
rank reported to ``torchrun-failures.log``). Each rank torchrun starts is
``python -m hpctrain.runtime.script_torchrun STATE_DIR``: a
:class:`ScriptTorchrunWorker`, the same wrapper as under srun
(``runtime/script_launcher.py``), which runs the user's script with torchrun's
environment (``RANK``, ``LOCAL_RANK``, ``TORCHELASTIC_*``...) and hpctrain's,
stops it, and records how it failed. So a script under torchrun gets what it
gets under srun: its own stop signal and grace, the failed rank named with its
exit code and last lines, requeue and resume.

torchrun runs with ``--tee 3``: each rank's output goes to the node's log with
a ``[default0]:`` prefix (the ranks of a node share one log) and to a file of
its own, so a failed rank's last lines are its own. Importing this imports no torch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import torchrun_failures_path
from hpctrain.runtime import failures
from hpctrain.runtime.context import TaskEnv
from hpctrain.runtime.script_launcher import ScriptLauncher
from hpctrain.runtime.script_outcome import PeerFailed, ScriptExit, ScriptFailed
from hpctrain.runtime.torchrun_node import (
    PEER_FAILURE,
    PEER_FAILURE_EXIT,
    SPEC_FILE,
    TorchrunNodeLauncher,
    write_failure,
    write_result,
)

SCRIPT_WORKER_MODULE = "hpctrain.runtime.script_torchrun"
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
        if not env.is_main:
            return None
        path = torchrun_failures_path(self.run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        return failures.StepLog(path)

    def start_reaper(self) -> None:
        """The node task's reaper covers this rank and its script (they carry the node task's token)."""

    def exit_without_result(self, status: int) -> None:
        env = getattr(self, "_env", None)
        rank = os.environ.get("RANK", str(os.getpid())) if env is None else str(env.global_rank)
        (self.state_dir / f"exit-{rank}").touch()
        super().exit_without_result(status)

    def save_failure_marker(self, own: ScriptExit) -> None:
        """Tell the node task why this rank ends (torchrun_node.death_reason): its line in srun's words."""
        self.save_failure(PEER_FAILURE if own.peer else f"the script {own.reason}")

    def save_failure(self, what: str) -> None:
        write_failure(self.state_dir, what)

    def save_result(self, result: dict[str, Any]) -> None:
        write_result(self.state_dir, result)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m {SCRIPT_WORKER_MODULE} STATE_DIR", file=sys.stderr)
        return 2
    state_dir = Path(args[0])
    payload = json.loads((state_dir / SPEC_FILE).read_text())
    worker = ScriptTorchrunWorker(
        payload["spec"], payload["run_dir"], payload["script_code"], payload.get("preempt_grace_s"), state_dir
    )
    try:
        result = worker()
    except PeerFailed:  # another rank failed first: this one's end is nobody's first failure
        worker.save_failure(PEER_FAILURE)
        return PEER_FAILURE_EXIT
    except ScriptFailed:  # its marker is written (save_failure_marker)
        return 1
    except Exception as exc:  # reported by the wrapper already; the marker is for the node task
        peer = failures.looks_like_peer_failure(exc)
        worker.save_failure(PEER_FAILURE if peer else f"{type(exc).__name__}: {exc}")
        return PEER_FAILURE_EXIT if peer else 1
    worker.save_result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
