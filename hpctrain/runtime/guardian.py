"""The batch node's watcher: a one-task step on another node of a healing job's allocation.

When the node that runs the batch step dies, the supervisor dies with it, and
Slurm 22.05 (``--no-kill``) removes the node from the job, kills the batch
step and every step on it, and keeps the job RUNNING on the other nodes with
nothing left to do until the time limit (measured on the test cluster). So
the supervisor starts this watcher on another node (``srun --overlap``,
step name :data:`STEP_NAME`, its output to a file so that it does not depend
on the srun client on the batch node). It reads the supervisor's record
(``.hpctrain/supervisor.json``, rewritten every few seconds): when the record
is older than :data:`SILENT_S` and the batch node's slurmd does not answer,
it records the node failure, requeues the job and sets ``ExcNodeList``. It
ends when the record says the supervisor ended, or belongs to another start.
Torch-free.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpctrain.contract.heartbeat_files import read_heartbeats
from hpctrain.contract.rundir import latest_checkpoint_step, read_json_object, supervisor_record_path
from hpctrain.runtime import healing

STEP_NAME = "hpctrain-guard"
POLL_S = 2.0
SILENT_S = 20.0  # the supervisor rewrites its record every supervisor.RECORD_EVERY_S


def guard(sup: Any, batch_node: str, *, poll_s: float = POLL_S, silent_s: float = SILENT_S) -> int:
    """Watch ``batch_node`` for supervisor ``sup`` (a :class:`~hpctrain.runtime.supervisor.Supervisor`
    built in this step); returns this step's exit status."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))  # the job ends or is requeued
    path = supervisor_record_path(sup.run_dir)
    while True:
        record = read_json_object(path) or {}
        if record.get("job_id") != sup.job_id or record.get("restart") != sup.restart or record.get("ended"):
            return 0
        written = record.get("time")
        silent = not isinstance(written, (int, float)) or time.time() - written > silent_s
        if silent and sup.lost_reason(batch_node) is not None:
            return take_out(sup, batch_node, record)
        time.sleep(poll_s)


def take_out(sup: Any, batch_node: str, record: dict[str, Any]) -> int:
    """Record the batch node's loss, requeue without it, and close the record (the next start knows)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the requeue's SIGTERM: ExcNodeList comes after it
    found = healing.Blame(batch_node, "the batch step's node does not answer")
    sup.excluded = list(dict.fromkeys([*sup.excluded, batch_node]))
    decision = healing.Decision("requeue", excluded=tuple(sup.excluded), why="it ran the batch step")
    checkpoint = latest_checkpoint_step(sup.run_dir)
    step = max((b.step for b in read_heartbeats(sup.run_dir) if b.node == batch_node), default=None)
    sup.record(found, decision, checkpoint, step)
    healing_say(healing.log_line(found, step, decision, checkpoint))
    sup.write_record(ended=True, batch_node=batch_node)
    return int(sup.requeue_or_fail(decision.why))


def healing_say(line: str) -> None:
    print(f"hpctrain guardian: {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str]) -> int:
    from hpctrain.runtime.supervisor import Supervisor, load_spec

    if len(argv) != 2:
        healing_say("usage: python -m hpctrain.runtime.guardian RUN_DIR BATCH_NODE")
        return 2
    import os

    run_dir = Path(argv[0])
    sup = Supervisor(run_dir, ["srun"], load_spec(run_dir), dict(os.environ))
    return guard(sup, argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
