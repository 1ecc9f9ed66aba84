"""What a healing job writes down, and how it leaves its allocation: node failures, its record, a requeue.

Shared by the batch step's supervisor (``healing/supervisor.py``) and the
guardian that watches the batch node from another one (``healing/guardian.py``):

* ``summary.json``: ``excluded_nodes`` and ``node_failures`` (kept by every
  later attempt, ``trainer/reporting.py``; one ``contract.node_records.NodeEvent``
  per decision: a node lost, flagged by the burn-in or evicted as slow), and
  the failure that ends the run;
* the user's bad-node ledger (``contract/bad_nodes.py``): each blamed node,
  with its evidence, unless ``health.ledger_days`` is 0;
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

from pydantic import ValidationError

from hpctrain.contract import bad_nodes
from hpctrain.contract.node_records import (
    NODE_EVENTS_KEY,
    NodeEvent,
    SupervisorRecord,
    appended,
    write_supervisor_record,
)
from hpctrain.contract.rundir import (
    latest_checkpoint_step,
    read_run_info,
    spec_path,
    supervisor_record_path,
)
from hpctrain.contract.runfiles import RunFileError, check_inside, printable, read_json
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import RunDirError
from hpctrain.healing import decide
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.yaml_source import read_spec_file

RECORD_EVERY_S = 5.0  # the guardian takes a record older than guardian.SILENT_S for a dead batch node
MAX_RECORD_BYTES = 64 << 10  # a record is a few hundred bytes


def load_spec(run_dir: Path) -> JobSpec:
    """The run's spec as submitted (its copy in the run directory, not a symlink out of it)."""
    check_inside(spec_path(run_dir), run_dir)
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
        record = SupervisorRecord(
            job_id=self.job_id,
            restart=self.restart,
            batch_node=batch_node or self.batch_node,
            ended=ended,
            nodes=list(nodes),
            time=round(time.time(), 3),
        )
        try:
            write_supervisor_record(self.run_dir, record)
        except OSError as exc:
            self.say(f"could not write {supervisor_record_path(self.run_dir)}: {exc}")

    def read_record(self) -> dict[str, Any]:
        return self.load_record()[0] or {}

    def load_record(self) -> tuple[dict[str, Any] | None, str | None]:
        """The supervisor's record (``contract/node_records.py``'s typed one), or None and why it cannot be
        read (missing, not a regular file, larger than a record, not a supervisor record): the guardian must
        tell "unreadable" from "another start's"."""
        path = supervisor_record_path(self.run_dir)
        try:
            value = read_json(path, MAX_RECORD_BYTES, within=self.run_dir)
        except FileNotFoundError:
            return None, f"{path} is missing"
        except (OSError, ValueError, RecursionError, RunFileError) as exc:
            return None, printable(getattr(exc, "message", None) or f"{path}: {exc}")
        try:
            return SupervisorRecord.model_validate(value).model_dump(), None
        except ValidationError:
            return None, f"{path} is not a supervisor record"

    # -- summary.json --------------------------------------------------------------------------------------------
    def add_failure(self, found: decide.Blame, decision: decide.Decision, step: int | None) -> list[dict[str, Any]]:
        """Record the loss of ``found.node``; every node event of the run so far, this one last."""
        return self.add_events([found], decision, step)

    def add_events(
        self,
        blamed: Sequence[decide.Blame],
        decision: decide.Decision,
        step: int | None,
        evidence: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Record a decision about the ``blamed`` nodes (with the run's last checkpoint now), keep the
        decision's excluded nodes, and add the nodes to the user's ledger; every node event of the run so far,
        these last. ``evidence``: node -> the numbers behind its blame, for the ledger."""
        self.excluded = list(decision.excluded)
        summary = read_summary(self.run_dir)
        fields = summary.fields() if summary is not None else {}
        events = fields.get(NODE_EVENTS_KEY)
        checkpoint = latest_checkpoint_step(self.run_dir)
        moment = round(time.time(), 3)  # one decision, one time: the crash-loop check counts it once
        for found in blamed:
            event = NodeEvent(
                node=found.node,
                kind=found.kind,
                step=step,
                checkpoint_step=checkpoint,
                reason=found.reason,
                action=decision.action,
                nodes=list(decision.nodes),
                job_id=self.job_id,
                time=moment,
            )
            events = appended(events, event.model_dump(mode="json"))
        fields.update({NODE_EVENTS_KEY: events, "excluded_nodes": list(decision.excluded)})
        if decision.continues:
            fields["status"] = "running"
        write_summary(self.run_dir, fields)
        self.remember(blamed, step, evidence or {})
        return list(events)

    def remember(self, blamed: Sequence[decide.Blame], step: int | None, evidence: Mapping[str, Any]) -> None:
        """The blamed nodes go into the user's bad-node ledger (``health.ledger_days``; 0: not at all)."""
        days = self.spec.health.ledger_days
        if not days or not blamed:
            return
        entries = [
            bad_nodes.new_entry(
                found.node,
                cluster=self.cluster,
                reason=found.reason,
                kind=found.kind,
                evidence={"step": step, **dict(evidence.get(found.node) or {})},
                run=str(self.run_dir),
                job_id=self.job_id,
                expiry_s=days * 86400.0,
            )
            for found in blamed
        ]
        try:
            bad_nodes.append_entries(entries)
        except OSError as exc:
            self.say(f"could not add {','.join(f.node for f in blamed)} to the bad-node ledger: {exc}")

    @property
    def cluster(self) -> str:
        """The cluster profile the run was submitted to (run.json), for the ledger."""
        try:
            value = read_run_info(self.run_dir).get("cluster")
        except RunDirError:
            value = None
        return value if isinstance(value, str) else ""

    @property
    def can_requeue(self) -> bool:
        """Whether this job may still requeue (requeues on, not spent)."""
        signals = self.spec.signals
        return signals.requeue_on_preemption and self.restart < signals.max_requeues

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
        if not self.can_requeue:
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
