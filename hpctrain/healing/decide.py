"""What to do about a node: which one to blame after a failed step, and the one decision for every cause. Pure.

The batch step's supervisor (``healing/supervisor.py``) gathers what it saw of
a step -- srun's reports of failed tasks and lost nodes, Slurm's node states,
which nodes' slurmd stopped answering, heartbeats gone silent, the hang
watchdog's culprit -- into a :class:`StepOutcome`; :func:`blame` names the
node. Blame goes to the strongest evidence first: a node that is gone
outright, a rank killed by a signal (its node), a hung rank (its node), a node
whose every rank went silent. A rank that merely raised names no node: that
is the code's fault, and the job fails as it would without healing.

A lost node is one :class:`Blame` kind; burn-in's flagged nodes
(``healing/burn_in.py``) and a slow node evicted during training
(``healing/eviction.py``) are the others, and all go through :func:`decide`:

* **keep**: train on the same nodes (a sick node that cannot be replaced,
  dropped, or requeued away from: requeues are off or spent);
* **swap**: the same number of nodes, a spare in the blamed node's place;
* **drop**: fewer nodes, down to ``min_nodes``, in a number the run's global
  batch can be shared by (``batch_fits``: any number of ranks up to the run's
  micro-batches, ``jobspec/shares.py``);
* **requeue**: without the blamed nodes (``ExcNodeList``), when too few are
  left, or the lost node ran the batch step; never into a job its partition
  can no longer run (:class:`Room`, from ``sinfo``: then a flagged node is
  kept, a lost one Slurm still runs jobs on is not kept out, a gone one fails);
* **fail**: a lost node with no requeue left, or a crash loop: the run's
  checkpoints stopped advancing over ``signals.crash_loop_attempts`` attempts
  (:func:`crash_loop`), whatever the rest would do;
* **start**: before the first step, nothing blamed: the nodes to start on
  (the allocation without the run's excluded nodes), or requeue/fail when too
  few are left.

Every node question -- the first start's choice, a lost node, the batch node's
loss (the guardian, or the next start looking back), the burn-in's verdict, a
slow node, a crash loop -- is one :class:`Situation` handed to :func:`decide`
(``HealRecord.situation`` builds it from the run's record), and every answer
is carried out in one place, ``HealRecord.carry_out`` (``healing/record.py``):
recorded, said, then a requeue with ``ExcNodeList`` or the run failed.
``tests/unit/test_healing_decide.py`` lists the callers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from hpctrain.contract.srun_report import TaskFailure
from hpctrain.jobspec.batch import BatchLayout, micro_batch_problem

if TYPE_CHECKING:
    from hpctrain.jobspec.models import JobSpec

Action = Literal["start", "keep", "swap", "drop", "requeue", "fail"]
BlameKind = Literal["lost", "burn-in", "slow"]  # gone or killed; flagged by the burn-in; evicted as slow

# Step-reason words that mean the task was killed rather than that it raised.
_KILLED_WORDS = ("killed", "signal", "terminated", "segmentation", "aborted", "bus error")
_EXIT_CODE = re.compile(r"exit code (\d+)")
# "srun: error: Node failure on n2", "srun: error: Task launch for StepId=9.1 failed on node n2: ..."
_NODE_FAILURE = re.compile(
    r"^srun: error: (?:Node failure on (?P<node>[^\s:]+)|.*failed on node (?P<launch>[^\s:]+))", re.M
)
# sinfo %T states in which a node should get no more work; a trailing '*' means it does not respond.
_BAD_NODE_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "unknown")
# Of those, the ones Slurm or an administrator decided: the node is out whether its slurmd answers or not.
BAD_BY_DECISION = ("down", "drain", "drained", "draining", "fail", "failing")


@dataclass(frozen=True)
class HungRank:
    """The hang watchdog's culprit as its report in summary.json names it (``runtime/hang.py``)."""

    rank: int
    node: str
    phase: str | None = None  # its last recorded phase
    step: int | None = None
    frozen_s: float | None = None  # its whole process froze: its heartbeat was silent this long

    def reason(self) -> str:
        """``rank 2 hung in phase forward_backward at step 5 (its process froze: heartbeat silent 18 s)``."""
        where = f"rank {self.rank} hung in phase {self.phase or 'unknown'}"
        if self.step is not None:
            where += f" at step {self.step}"
        if self.frozen_s is not None:
            return f"{where} (its process froze: heartbeat silent {self.frozen_s:.0f} s)"
        return f"{where} (no progress)"


@dataclass(frozen=True)
class StepOutcome:
    """What the supervisor saw of one training step."""

    nodes: tuple[str, ...]  # the step's nodes, in rank order
    exit_code: int | None = None  # srun's status; None when the supervisor ended it
    task_failures: tuple[TaskFailure, ...] = ()  # srun's reports, first first
    lost_nodes: Mapping[str, str] = field(default_factory=dict)  # node -> why it is gone
    silent_nodes: frozenset[str] = frozenset()  # every rank's heartbeat went silent
    hung: HungRank | None = None  # the hang watchdog's culprit, when it ended the step
    sick: tuple[Blame, ...] = ()  # nodes flagged by the burn-in or evicted as slow: blamed before anything else
    evidence: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # node -> the numbers behind it


@dataclass(frozen=True)
class Blame:
    node: str
    reason: str  # e.g. "rank 3 killed", "slurmd does not answer", "compute 412 ms vs 150 ms (2.7x)"
    kind: BlameKind = "lost"


@dataclass(frozen=True)
class Decision:
    action: Action
    nodes: tuple[str, ...] = ()  # where the next step runs (continue)
    excluded: tuple[str, ...] = ()  # every node the run keeps away from
    why: str = ""  # for a keep, a requeue or a failure
    requeued_by_slurm: bool = False  # a requeue that already happened: recorded, not carried out again
    if_requeue_fails: Literal["keep", "fail"] = "fail"  # when Slurm refuses the requeue

    @property
    def continues(self) -> bool:
        """The run goes on inside the allocation (start, keep, swap, drop)."""
        return self.action in ("start", "keep", "swap", "drop")


@dataclass(frozen=True)
class Room:
    """Where a requeued job could start again: each of its partitions' nodes that may run a job (sinfo).

    A requeue keeps the job's request (``nodes`` + ``spare_nodes``); Slurm never starts it on fewer, and a
    job that excludes too many of its partition's nodes pends with ``Reason=BadConstraints`` forever."""

    partitions: Mapping[str, tuple[str, ...]]  # partition -> its usable nodes
    needs: int  # the nodes the job asks Slurm for
    submitted: tuple[str, ...] = ()  # the job's own ExcNodeList (its --exclude: the spec's, the ledger's)

    def left(self, excluded: Sequence[str]) -> tuple[str, int]:
        """The partition with the most usable nodes outside ``excluded`` and the job's own, and how many."""
        out = set(excluded) | set(self.submitted)
        counts = {name: len(set(nodes) - out) for name, nodes in self.partitions.items()}
        best = max(counts, key=lambda name: counts[name], default="")
        return best, counts.get(best, 0)

    def shortfall(self, excluded: Sequence[str]) -> str | None:
        """Why a requeue that keeps ``excluded`` out could never start; None when it can."""
        partition, count = self.left(excluded)
        if count >= self.needs:
            return None
        also = [n for n in self.submitted if n not in excluded and any(n in ns for ns in self.partitions.values())]
        besides = f" (besides {','.join(also)}, excluded at submit)" if also else ""
        return (
            f"excluding {','.join(excluded)}{besides} would leave {count} usable node{'s' * (count != 1)} in "
            f"partition {partition}, the job needs {self.needs}"
        )


@dataclass(frozen=True)
class Situation:
    """Everything the decider reads about one node question: what is blamed, where the run stands, what it may do.

    ``HealRecord.situation`` (``healing/record.py``) builds it from the run's record; a test, by hand.
    """

    blamed: tuple[Blame, ...]  # (): before the first step, which nodes to start on
    step_nodes: tuple[str, ...]  # the step's nodes in rank order; () before the first step
    allocation: tuple[str, ...]  # the job's nodes
    excluded: tuple[str, ...]  # nodes the run keeps away from already
    batch_node: str  # the node of the batch step (its loss ends the allocation's use)
    nodes: int  # resources.nodes
    min_nodes: int  # the fewest the run trains on
    fits: Callable[[int], bool]  # whether the run's global batch can be shared by that many nodes
    can_requeue: bool = True  # requeues on and not spent (and worth it: never for a slow node)
    requeued_by_slurm: bool = False  # this start is the requeue already: the last start's batch node died with it
    ranks_alive: bool = False  # the ranks still run on ``step_nodes``: a requeue Slurm refuses keeps them
    step: int | None = None  # the run's last step, for the record and the crash loop's account
    checkpoint_step: int | None = None  # the run's last complete checkpoint now
    history: tuple[Mapping[str, Any], ...] = ()  # the run's node events so far (summary.json)
    job_id: str = ""
    crash_loop_attempts: int | None = None  # signals.crash_loop_attempts; None: this question ends no crash loop
    room: Callable[[], Room | str] | None = None  # asked before a requeue: Room, or why Slurm cannot say


def node_failures_in(text: str) -> list[str]:
    """Nodes srun says it lost, in order. Pure."""
    found = [m.group("node") or m.group("launch") for m in _NODE_FAILURE.finditer(text)]
    return list(dict.fromkeys(found))


def bad_node_state(state: str) -> bool:
    """Whether an ``sinfo -o %T`` state means the node should get no more work."""
    state = state.strip().lower()
    return state.endswith("*") or state.rstrip("*~#$@%!^-") in _BAD_NODE_STATES


def was_killed(reason: str) -> bool:
    """Whether srun's reason for a failed task says it was killed (a signal, or an exit status of 128+)."""
    text = reason.lower()
    code = _EXIT_CODE.search(text)
    return any(word in text for word in _KILLED_WORDS) or (code is not None and int(code.group(1)) >= 128)


def blame(outcome: StepOutcome) -> Blame | None:
    """The node to take out after a failed step, or None when no node is at fault."""
    for node in outcome.nodes:
        if node in outcome.lost_nodes:
            return Blame(node, outcome.lost_nodes[node])
    first = outcome.task_failures[0] if outcome.task_failures else None
    if first is not None and first.node in outcome.nodes and was_killed(first.reason):
        return Blame(first.node, f"rank {first.rank} {_short_reason(first.reason)}")
    if outcome.hung is not None and outcome.hung.node in outcome.nodes:
        return Blame(outcome.hung.node, outcome.hung.reason())
    for node in outcome.nodes:
        if node in outcome.silent_nodes:
            return Blame(node, "every rank's heartbeat went silent")
    return None


def _short_reason(reason: str) -> str:
    code = _EXIT_CODE.search(reason.lower())
    return f"exited {code.group(1)}" if code else reason.strip().lower()


def batch_fits(spec: JobSpec, count: int) -> bool:
    """Whether the run's global batch can be shared by ``count`` nodes' ranks (always, for user code).

    An elastic strategy's can on any number of ranks up to its micro-batches (``jobspec/shares.py``),
    so on any count from ``min_nodes`` to ``nodes``; the others only on ``nodes`` (validate says so).
    """
    if not spec.runs_trainer or count == spec.resources.nodes:
        return True
    gpus_per_task = (spec.resources.gpus_per_node or 0) // spec.tasks_per_node
    fewer = BatchLayout.of(spec.trainer, tasks=count * spec.tasks_per_node, gpus_per_task=gpus_per_task)
    return micro_batch_problem(spec.batch_layout.processes, fewer.processes, strategy=spec.trainer.strategy) is None


def choose_nodes(
    survivors: Sequence[str], spares: Sequence[str], *, nodes: int, min_nodes: int, fits: Callable[[int], bool]
) -> tuple[str, ...] | None:
    """The next step's nodes: survivors, then spares, as many as possible up to ``nodes`` and at least
    ``min_nodes``, in a number ``fits`` accepts (the global batch can be shared by them); None if none fits."""
    pool = [*survivors, *(n for n in spares if n not in survivors)]
    for count in range(min(nodes, len(pool)), min_nodes - 1, -1):
        if count == nodes or fits(count):
            return tuple(pool[:count])
    return None


def decide(situation: Situation) -> Decision:
    """The one answer to a node question: start, keep, swap, drop, requeue or fail (see the module docstring)."""
    if not situation.blamed:
        return _first_start(situation) if not situation.step_nodes else _keep(situation)
    return _unless_a_crash_loop(situation, _about_blamed(situation))


def _first_start(s: Situation) -> Decision:
    healthy = [n for n in s.allocation if n not in s.excluded]
    chosen = choose_nodes(healthy, [], nodes=s.nodes, min_nodes=s.min_nodes, fits=s.fits)
    if chosen is None:
        why = f"{len(healthy)} healthy node{'s' * (len(healthy) != 1)} left, min_nodes is {s.min_nodes}"
        return _requeue_or_not(s, s.excluded, why, lost=True)
    return Decision("start", nodes=chosen, excluded=s.excluded)


def _keep(s: Situation) -> Decision:
    return Decision("keep", nodes=s.step_nodes, excluded=s.excluded)


def _about_blamed(s: Situation) -> Decision:
    out = tuple(dict.fromkeys([*s.excluded, *(b.node for b in s.blamed)]))
    lost = [b for b in s.blamed if b.kind == "lost"]
    if any(b.node == s.batch_node for b in lost):
        if s.requeued_by_slurm:
            return Decision("requeue", excluded=out, why="Slurm requeued the job", requeued_by_slurm=True)
        return _requeue_or_not(s, out, f"{s.batch_node} ran the batch step", lost=True)
    survivors = [n for n in s.step_nodes if n not in out]
    spares = [n for n in s.allocation if n not in out and n not in s.step_nodes]
    chosen = choose_nodes(survivors, spares, nodes=s.nodes, min_nodes=s.min_nodes, fits=s.fits)
    if chosen is None:
        left = len(survivors) + len(spares)
        why = f"{left} healthy node{'s' * (left != 1)} left, min_nodes is {s.min_nodes}"
        return _requeue_or_not(s, out, why, lost=bool(lost))
    return Decision("drop" if len(chosen) < len(s.step_nodes) else "swap", nodes=chosen, excluded=out)


def _requeue_or_not(s: Situation, out: tuple[str, ...], why: str, *, lost: bool) -> Decision:
    if s.can_requeue:
        fallback: Literal["keep", "fail"] = "keep" if s.ranks_alive and not lost else "fail"
        room = s.room() if s.room is not None else None
        if isinstance(room, str):  # sinfo failed: requeue as if there were room, and say so
            return Decision("requeue", excluded=out, why=f"{why}; {room}", if_requeue_fails=fallback)
        short = room.shortfall(out) if room is not None else None
        if room is None or short is None:
            return Decision("requeue", excluded=out, why=why, if_requeue_fails=fallback)
        return _no_room(s, room, out, short, lost=lost)
    if lost:
        return Decision("fail", excluded=out, why=f"{why}; no requeue left (signals.max_requeues)")
    return Decision("keep", nodes=s.step_nodes, excluded=s.excluded, why=f"{why}, and no requeue left: kept")


def _no_room(s: Situation, room: Room, out: tuple[str, ...], short: str, *, lost: bool) -> Decision:
    """A requeue without ``out`` could never start: keep a sick node that still trains; for a lost one, requeue
    without keeping out the blamed nodes Slurm still runs jobs on, or fail rather than pend forever."""
    if not lost and s.step_nodes:
        return Decision("keep", nodes=s.step_nodes, excluded=s.excluded, why=f"{short}: kept")
    usable = {node for nodes in room.partitions.values() for node in nodes}
    softer = tuple(n for n in out if n in s.excluded or n not in usable)
    if softer != out and room.shortfall(softer) is None:
        let_in = ",".join(n for n in out if n not in softer)
        why = f"{short}, so {let_in} (which Slurm still runs jobs on) is not kept out"
        return Decision("requeue", excluded=softer, why=why, if_requeue_fails="fail")
    return Decision("fail", excluded=out, why=f"{short}: a requeue could never start (it would pend forever)")


def _unless_a_crash_loop(s: Situation, decision: Decision) -> Decision:
    """``fail`` when this attempt is the ``crash_loop_attempts``-th in a row without a newer checkpoint."""
    if s.crash_loop_attempts is None or decision.action == "fail":
        return decision
    first = s.blamed[0]
    now = {"job_id": s.job_id, "time": None, "checkpoint_step": s.checkpoint_step, "node": first.node}
    loop = crash_loop([*s.history, {**now, "step": s.step, "reason": first.reason}], s.crash_loop_attempts)
    if loop is None:
        return decision
    since = f"step {s.checkpoint_step}" if s.checkpoint_step is not None else "the start"
    why = (
        f"crash loop: {len(loop)} attempts in a row ended without a checkpoint newer than {since} "
        f"({describe_attempts(loop)})"
    )
    return Decision("fail", excluded=decision.excluded, why=why)


def crash_loop(failures: Sequence[Mapping[str, Any]], limit: int) -> list[Mapping[str, Any]] | None:
    """The last ``limit`` node failures when none of them came after a newer checkpoint, else None.

    Each record holds the step of the run's last complete checkpoint when it
    happened (``checkpoint_step``, None before the first): the same value
    ``limit`` times in a row means the attempts between them saved nothing.
    """
    attempts: list[Mapping[str, Any]] = []
    for record in failures:  # several nodes blamed by one decision (same job and time) are one attempt
        same = attempts and (attempts[-1].get("job_id"), attempts[-1].get("time")) == (
            record.get("job_id"),
            record.get("time"),
        )
        if not same or record.get("time") is None:
            attempts.append(record)
    failures = attempts
    if len(failures) < limit:
        return None
    last = failures[-limit:]
    steps = {record.get("checkpoint_step") for record in last}
    return list(last) if len(steps) == 1 else None


def describe_attempts(failures: Sequence[Mapping[str, Any]]) -> str:
    """``attempt 1 (job 12): n2 at step 40, rank 3 killed; ...`` for a crash-loop message."""
    parts = []
    for index, record in enumerate(failures, start=1):
        parts.append(
            f"attempt {index} (job {record.get('job_id')}): {record.get('node')} at step {record.get('step')}, "
            f"{record.get('reason')}"
        )
    return "; ".join(parts)


_VERBS: dict[str, str] = {"lost": "lost", "burn-in": "flagged by the burn-in", "slow": "evicted as slow"}


def log_line(found: Blame, step: int | None, decision: Decision, checkpoint_step: int | None) -> str:
    """The one line the job log gets, e.g. ``node n2 lost at step 412 (rank 3 exited 137); continuing on
    n1,n3 from step 400``."""
    where = f"at step {step}" if step is not None else "before the first step"
    head = f"node {found.node} {_VERBS.get(found.kind, found.kind)} {where} ({found.reason})"
    start = f"step {checkpoint_step}" if checkpoint_step is not None else "the start"
    if decision.action in ("swap", "drop"):
        return f"{head}; continuing on {','.join(decision.nodes)} from {start}"
    if decision.action == "keep":
        return f"{head}; training on it anyway: {decision.why}"
    if decision.action == "requeue":
        return f"{head}; requeueing without {','.join(decision.excluded)} ({decision.why})"
    return f"{head}; stopping: {decision.why}"
