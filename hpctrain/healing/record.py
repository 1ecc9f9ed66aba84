"""What a healing job knows and writes down, and the one executor of its node decisions.

Shared by the batch step's supervisor (``healing/supervisor.py``), the
guardian that watches the batch node from another one (``healing/guardian.py``)
and a plain job's burn-in (``healing/burn_in.py``). :meth:`HealRecord.situation`
is the run as the decider sees it (``decide.Situation``);
:meth:`HealRecord.carry_out` is the one place a decision is carried out:

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
  node; when Slurm refuses it, the decision's fallback (keep ranks that still
  run, else fail the run).

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
from hpctrain.contract.checkpoint_listing import latest_checkpoint_step
from hpctrain.contract.node_records import (
    NODE_EVENTS_KEY,
    NodeEvent,
    SupervisorRecord,
    appended,
    write_supervisor_record,
)
from hpctrain.contract.rundir import read_run_info, spec_path, supervisor_record_path
from hpctrain.contract.runfiles import RunFileError, check_inside, printable, read_json
from hpctrain.contract.slurm import Slurm, SlurmCommandError
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.errors import HpctrainError, RunDirError
from hpctrain.healing import decide
from hpctrain.jobscript.parameters import node_needs
from hpctrain.jobspec.models import JobSpec
from hpctrain.jobspec.yaml_source import read_spec_file
from hpctrain.runtime.task_env import parse_hostlist

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
        self.partition = spec.resources.partition or environ.get("SLURM_JOB_PARTITION") or None
        self.submitted_excluded: list[str] = []  # the job's own ExcNodeList, kept by a requeue (read by room)
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

    # -- the decider's view, and the one executor ---------------------------------------------------------------
    def situation(
        self,
        blamed: Sequence[decide.Blame],
        *,
        step_nodes: Sequence[str],
        allocation: Sequence[str],
        step: int | None = None,
        can_requeue: bool | None = None,
        batch_node: str | None = None,
        requeued_by_slurm: bool = False,
        ranks_alive: bool = False,
        crash_loop: bool = False,
    ) -> decide.Situation:
        """The node question about ``blamed`` (none: which nodes to start on) as ``decide.decide`` reads it.

        ``can_requeue``: None for the run's own answer (:attr:`can_requeue`); ``crash_loop``: whether this
        answer may end the run as a crash loop (``signals.crash_loop_attempts``; after a failed step).
        """
        res = self.spec.resources
        history: list[Mapping[str, Any]] = []
        if crash_loop:
            summary = read_summary(self.run_dir)
            events = summary.fields().get(NODE_EVENTS_KEY) if summary is not None else None
            history = [e for e in events or [] if isinstance(e, dict)]
        return decide.Situation(
            blamed=tuple(blamed),
            step_nodes=tuple(step_nodes),
            allocation=tuple(allocation),
            excluded=tuple(self.excluded),
            batch_node=batch_node or self.batch_node,
            nodes=res.nodes,
            min_nodes=res.fewest_nodes,
            fits=lambda count: decide.batch_fits(self.spec, count),
            can_requeue=self.can_requeue if can_requeue is None else can_requeue,
            requeued_by_slurm=requeued_by_slurm,
            ranks_alive=ranks_alive,
            step=step,
            checkpoint_step=latest_checkpoint_step(self.run_dir) if blamed else None,
            history=tuple(history),
            job_id=self.job_id,
            crash_loop_attempts=self.spec.signals.crash_loop_attempts if crash_loop else None,
            room=self.room,
        )

    def room(self) -> decide.Room | str:
        """Where a requeue of this job could start: its partitions' usable nodes (``sinfo``), or why that is not
        known (then the decider requeues as it did before it asked)."""
        where = f"partition {self.partition}" if self.partition else "the cluster"
        try:
            found = Slurm().usable_nodes(self.partition, needs=node_needs(self.spec))
        except SlurmCommandError as exc:
            return f"could not count the usable nodes of {where} ({exc.message}): requeued without checking"
        if not found:
            return f"sinfo listed no usable node of {where}: requeued without checking"
        self.submitted_excluded = self._job_excluded()
        usable = {name: tuple(nodes) for name, nodes in found.items()}
        return decide.Room(usable, self.spec.resources.allocated_nodes, tuple(self.submitted_excluded))

    def _job_excluded(self) -> list[str]:
        """The job's ExcNodeList now (its ``--exclude``: the spec's own and the ledger's); [] when Slurm cannot
        say. A requeue's ``ExcNodeList`` replaces it, so the requeue keeps these too."""
        try:
            listed = Slurm().show_job(self.job_id).get("ExcNodeList", "")
        except SlurmCommandError:
            return []
        if not listed or listed == "(null)":
            return []
        try:
            return parse_hostlist(listed, variable="ExcNodeList")
        except HpctrainError:
            return []

    def carry_out(
        self,
        situation: decide.Situation,
        decision: decide.Decision,
        evidence: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> decide.Decision:
        """Record the decision about ``situation.blamed`` (summary.json's node events, the ledger), say it, and do
        it: requeue with ``ExcNodeList``, or fail the run. The decision as done: a requeue Slurm refused becomes its
        fallback (``if_requeue_fails``). The only place a healing job requeues or fails for a node."""
        if situation.blamed:
            events = self.add_events(situation.blamed, decision, situation.step, evidence)
            checkpoint = events[-1]["checkpoint_step"]
            for found in situation.blamed:
                self.say(decide.log_line(found, situation.step, decision, checkpoint))
        elif decision.action in ("requeue", "fail") and decision.why:
            self.say(
                f"before the first step: {'requeueing' if decision.action == 'requeue' else 'stopping'}: {decision.why}"
            )
        if decision.action == "fail":
            self.fail(decision.why)
        elif decision.action == "requeue" and not decision.requeued_by_slurm:
            refused = self._requeue()
            if refused is not None and decision.if_requeue_fails == "keep":
                decision = decide.Decision(
                    "keep",
                    nodes=situation.step_nodes,
                    excluded=situation.excluded,
                    why=f"the requeue failed: {refused}",
                )
                self.say(f"could not requeue ({refused}): training on {','.join(decision.nodes)}")
                self.add_events((), decision, situation.step)  # the last events' action is keep, and so is the run
            elif refused is not None:
                decision = decide.Decision(
                    "fail", excluded=decision.excluded, why=f"{decision.why}; requeue failed: {refused}"
                )
                self.fail(decision.why)
        return decision

    # -- summary.json --------------------------------------------------------------------------------------------
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
        if not blamed and isinstance(events, list):  # the last decision, done otherwise (carry_out): its events
            last = [e for e in events if isinstance(e, dict)][-1:]
            for event in events:
                if isinstance(event, dict) and last and event.get("time") == last[0].get("time"):
                    event["action"], event["why"] = decision.action, decision.why[:2000]
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
                why=decision.why[:2000] or None,
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
    def _requeue(self) -> str | None:
        """Requeue with the excluded nodes kept out (``ExcNodeList``); None, or why Slurm refused."""
        try:
            Slurm().requeue_job(self.job_id)
        except SlurmCommandError as exc:
            return str(exc)
        self._exclude_from_next_start()
        return None

    def _exclude_from_next_start(self) -> None:
        """``ExcNodeList`` for the requeued job. Slurm takes it only from a pending job ("Job is no longer
        pending execution" before the requeue, measured on 22.05); the supervisor is the batch step's main
        process (``exec``), so the requeue's SIGTERM leaves it KillWait to say it."""
        nodes = list(dict.fromkeys([*self.submitted_excluded, *self.excluded]))
        if not nodes:
            return
        try:
            Slurm().exclude_nodes(self.job_id, nodes)
        except SlurmCommandError as exc:
            self.say(f"could not keep {','.join(nodes)} out of the next start: {exc}")
