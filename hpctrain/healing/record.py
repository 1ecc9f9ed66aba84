"""What a healing job writes down, and how it leaves its allocation: node failures, its record, a requeue.

Shared by the batch step's supervisor (``healing/supervisor.py``) and the
guardian that watches the batch node from another one (``healing/guardian.py``):

* ``summary.json``: ``excluded_nodes`` and ``node_failures`` (kept by every
  later attempt, ``trainer/reporting.py``), and the failure that ends the run;
* ``.hpctrain/supervisor.json``: which start of the job runs where, and, by
  its ``time``, that the supervisor is alive (rewritten every
  :data:`RECORD_EVERY_S`);
* the requeue: ``scontrol requeue``, then ``ExcNodeList`` with every excluded
  node, or a failure when requeues are spent or off.

Torch-free.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctrain.contract.rundir import (
    latest_checkpoint_step,
    read_json_object,
    spec_path,
    supervisor_record_path,
    write_json_atomic,
)
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.healing import decide
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.yaml_source import read_spec_file

RECORD_EVERY_S = 5.0  # the guardian takes a record older than guardian.SILENT_S for a dead batch node


def load_spec(run_dir: Path) -> JobSpec:
    """The run's spec as submitted (its copy in the run directory)."""
    data, _ = read_spec_file(spec_path(run_dir))
    return JobSpec.model_validate(data)


class HealRecord:
    """One start of a healing job: what it knows of the run's lost nodes, and how it writes them down."""

    def __init__(
        self, run_dir: Path, spec: JobSpec, environ: Mapping[str, str], say: Callable[[str], None] = print
    ) -> None:
        self.run_dir, self.spec, self.say = run_dir, spec, say
        self.job_id = environ["SLURM_JOB_ID"]
        self.restart = int(environ.get("SLURM_RESTART_COUNT") or 0)
        self.batch_node = environ.get("SLURMD_NODENAME") or socket.gethostname()
        previous = read_summary(run_dir)
        recorded = previous.fields().get("excluded_nodes") if previous is not None else None
        self.excluded: list[str] = [n for n in recorded if isinstance(n, str)] if isinstance(recorded, list) else []

    # -- the supervisor's record ---------------------------------------------------------------------------------
    def write_record(self, nodes: Sequence[str], *, ended: bool = False, batch_node: str | None = None) -> None:
        """What the guardian and a later start of this job need to know about this one; its ``time`` says
        the supervisor is alive."""
        record = {
            "job_id": self.job_id,
            "restart": self.restart,
            "batch_node": batch_node or self.batch_node,
            "ended": ended,
            "nodes": list(nodes),
            "time": round(time.time(), 3),
        }
        try:
            write_json_atomic(supervisor_record_path(self.run_dir), record)
        except OSError as exc:
            self.say(f"could not write {supervisor_record_path(self.run_dir)}: {exc}")

    def read_record(self) -> dict[str, Any]:
        return read_json_object(supervisor_record_path(self.run_dir)) or {}

    # -- summary.json --------------------------------------------------------------------------------------------
    def add_failure(self, found: decide.Blame, decision: decide.Decision, step: int | None) -> list[dict[str, Any]]:
        """Record the loss of ``found.node`` (with the run's last checkpoint now) and keep the decision's
        excluded nodes; every node failure of the run so far, this one last."""
        self.excluded = list(decision.excluded)
        summary = read_summary(self.run_dir)
        fields = summary.fields() if summary is not None else {}
        failures = [f for f in fields.get("node_failures") or [] if isinstance(f, dict)]
        failures.append(
            {
                "node": found.node,
                "step": step,
                "checkpoint_step": latest_checkpoint_step(self.run_dir),
                "reason": found.reason,
                "action": decision.action,
                "nodes": list(decision.nodes),
                "job_id": self.job_id,
                "time": round(time.time(), 3),
            }
        )
        fields.update(node_failures=failures, excluded_nodes=list(decision.excluded))
        if decision.action == "continue":
            fields["status"] = "running"
        write_summary(self.run_dir, fields)
        return failures

    def fail(self, why: str) -> None:
        """The run ends failed with ``why``; the last node failure's action becomes ``fail``."""
        summary = read_summary(self.run_dir)
        fields = summary.fields() if summary is not None else {}
        failures = [f for f in fields.get("node_failures") or [] if isinstance(f, dict)]
        if failures:
            failures[-1]["action"] = "fail"
        fields.update(node_failures=failures, status="failed", error=why)
        write_summary(self.run_dir, fields)

    # -- leaving the allocation ----------------------------------------------------------------------------------
    def requeue_or_fail(self, why: str) -> int:
        """Requeue with the excluded nodes kept out (``ExcNodeList``), or fail when requeues are spent or off;
        the batch step's exit status."""
        signals = self.spec.signals
        if not signals.requeue_on_preemption or self.restart >= signals.max_requeues:
            self.fail(f"{why}; no requeue left (signals.max_requeues)")
            return 1
        try:
            Slurm().requeue_job(self.job_id)
        except SlurmCommandError as exc:
            self.say(f"could not requeue: {exc}")
            self.fail(f"{why}; requeue failed: {exc}")
            return 1
        self._exclude_from_next_start()
        return 0

    def _exclude_from_next_start(self) -> None:
        """``ExcNodeList`` for the requeued job. Slurm takes it only from a pending job ("Job is no longer
        pending execution" before the requeue, measured on 22.05); the supervisor is the batch step's main
        process (``exec``), so the requeue's SIGTERM leaves it KillWait to say it."""
        if not self.excluded:
            return
        try:
            Slurm().exclude_nodes(self.job_id, self.excluded)
        except SlurmCommandError as exc:
            self.say(f"could not keep {','.join(self.excluded)} out of the next start: {exc}")
