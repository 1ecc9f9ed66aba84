"""Burn-in: before a multi-node step trains, every node is probed and a node worse than the others is taken out.

The task launcher calls :func:`run_burn_in` on every rank once the process
group is up and before the trainer (or the entry point) starts: the first
start, each requeue, each relaunch after a lost node. Within
``health.burn_in.budget_s`` every rank runs ``healing/probes.py``'s probes;
rank 0 gathers the numbers, scores the nodes (``healing/scores.py``: median
and MAD of the other nodes), writes the :class:`~hpctrain.contract.node_records.BurnIn`
record into ``summary.json`` and tells every rank the verdict. Then:

* nobody flagged: training starts (the burn-in cost only its probes);
* in a healing job (the supervisor set :data:`STEP_ID_VAR`): every rank exits
  with :data:`BURN_IN_EXIT`; the supervisor reads the record and decides
  (``healing/decide.py``: swap for a spare, drop, requeue without it, keep);
* in any other job rank 0 decides the same way (no spare, no fewer nodes:
  requeue without the node, or keep it when requeues are off or spent),
  records it and the ledger entry, requeues with ``ExcNodeList`` and every
  rank leaves without a result (``runtime/requeue.py``'s exit protocol).

The probes run with a group and a kit: torch's (``probes.TorchGroup`` and
``probes.TorchKit``: the default process group, the run's model, NCCL or
gloo), or, for a CPU script's burn-in, ``plain_group.PlainGroup`` and
``plain_probes.PlainKit`` (TCP and a hash workload: no torch in that child).
Task side; torch-free at import (the torch kit is imported when used); the
trainer never imports it.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from hpctrain.contract.node_records import BURN_IN_KEY, BurnIn, NodeScore, appended
from hpctrain.contract.summary import read_summary, write_summary
from hpctrain.healing import decide, plain_probes, scores
from hpctrain.healing.plain_group import BUCKET_MB, PlainGroup
from hpctrain.healing.plain_probes import Rounds
from hpctrain.jobspec.node_health import BURN_IN_EXIT, BURN_IN_VAR, STEP_ID_VAR
from hpctrain.runtime import heartbeat
from hpctrain.runtime.context import TaskContext

log = logging.getLogger(__name__)

# Shares of one pass's budget: compute, ring all-reduce, pairwise all-reduce; the read probe gets the rest.
SHARES = (0.4, 0.15, 0.25)
PASSES = 2  # a flagged node is measured again: its better pass counts, compute and rates alike (pairs alone)


class Group(Protocol):
    """The collectives the burn-in makes (``probes.TorchGroup``, ``plain_group.PlainGroup``)."""

    rank: int

    def all_gather(self, value: Any) -> list[Any]: ...
    def broadcast(self, value: Any) -> Any: ...
    def barrier(self) -> None: ...


class Kit(Protocol):
    """The probes the prober runs (``probes.TorchKit``, ``plain_probes.PlainKit``); collective where the
    probe is."""

    def setup(self) -> None: ...
    def gpu_problems(self, first_on_node: bool) -> list[str]: ...
    def compute(self, deadline: float) -> list[float]: ...
    def ring(self, deadline: float) -> float | None: ...
    def pairs(
        self, leaders: Sequence[int], rounds: Rounds, deadline: float, *, one_at_a_time: bool
    ) -> dict[int, float]: ...
    def close(self) -> None: ...


class Prober:
    """This rank's probes: the workload built once (:meth:`setup`), measured once or twice (:meth:`measure`)."""

    def __init__(self, ctx: TaskContext, kit: Kit, node_index: int, nodes: int, leaders: Sequence[int]) -> None:
        self.ctx, self.kit, self.node_index, self.nodes, self.leaders = ctx, kit, node_index, nodes, leaders
        self.first = ctx.env.global_rank == leaders[node_index]  # the node's first rank: pairs and reads
        self.phases: dict[str, float] = {}

    def setup(self) -> None:
        started = time.perf_counter()
        self.kit.setup()
        self.phases["setup"] = round(time.perf_counter() - started, 3)

    def measure(self, deadline: float, *, confirming: bool = False) -> dict[str, Any]:
        """This rank's numbers, within ``deadline``; the pairwise and read numbers on a node's first rank.
        ``confirming``: the second pass, whose pairs run one at a time."""
        spec = self.ctx.spec
        budget = deadline - time.perf_counter()
        mine: dict[str, Any] = {"rank": self.ctx.env.global_rank, "gpu_problems": self.kit.gpu_problems(self.first)}
        mark = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            self.phases[name], mark = round(self.phases.get(name, 0.0) + now - mark, 3), now

        rounds_ms = self.kit.compute(mark + SHARES[0] * budget)
        mine["compute_rounds_ms"] = rounds_ms
        mine["compute_ms"] = round(statistics.median(rounds_ms), 3) if rounds_ms else None
        lap("compute")
        if spec.script is None:  # the bus bandwidth is recorded for our trainer's all-reduces; a script's are its own
            mine["ring_mb_s"] = self.kit.ring(time.perf_counter() + SHARES[1] * budget)
            lap("ring")
        rounds = scores.pair_rounds(self.nodes)
        until = time.perf_counter() + SHARES[2] * budget
        pairs = self.kit.pairs(self.leaders, rounds, until, one_at_a_time=confirming)
        lap("pairwise")
        if self.first:
            mine["allreduce_mb_s"] = pairs.get(self.node_index)
            if spec.data.root:
                root = Path(spec.data.root).expanduser()
                targets = plain_probes.read_targets(root, spec.data.train_dir, self.node_index, self.nodes)
                read_until = max(deadline, time.perf_counter() + plain_probes.MIN_READ_S)
                mine["read_mb_s"] = plain_probes.read_probe(targets, self.node_index, read_until)
            lap("read")
        return mine


def best_of(passes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One rank's numbers over its passes: its better pass's compute (the lower median of a pass's rounds),
    the highest rates; every round is kept in the record. A node stays flagged only when it was bad in both
    passes: a burst of load on a shared machine that lands on one node in one pass (CI #53: a healthy node of
    two flagged at 2x, its rounds pooled over both passes) does not. A throttled node is slow in both. Pure."""
    merged: dict[str, Any] = dict(passes[0])
    merged["compute_rounds_ms"] = [ms for p in passes for ms in p.get("compute_rounds_ms") or []]
    medians = [statistics.median(rounds) for p in passes if (rounds := p.get("compute_rounds_ms"))]
    if medians:
        merged["compute_ms"] = round(min(medians), 3)
    for key, pick in (("ring_mb_s", max), ("allreduce_mb_s", max), ("read_mb_s", max)):
        values = [p[key] for p in passes if isinstance(p.get(key), (int, float))]
        merged[key] = pick(values) if values else None
    merged["gpu_problems"] = list(dict.fromkeys(x for p in passes for x in p.get("gpu_problems") or []))
    return merged


def assess(
    ranks: Sequence[Mapping[str, Any]],
    names: Mapping[int, str],
    margin: float,
    mad_k: float,
    network_margin: float | None = None,
) -> BurnIn:
    """Rank 0's verdict from every rank's numbers (``names``: rank -> node). Pure."""
    compute: dict[str, float] = {}
    allreduce: dict[str, float] = {}
    read: dict[str, float] = {}
    gpu: dict[str, list[str]] = {}
    for one in ranks:
        node = names[int(one["rank"])]
        if isinstance(one.get("compute_ms"), (int, float)):
            compute[node] = max(compute.get(node, 0.0), float(one["compute_ms"]))  # a node is its slowest rank
        for key, into in (("allreduce_mb_s", allreduce), ("read_mb_s", read)):
            if isinstance(one.get(key), (int, float)):
                into[node] = float(one[key])
        gpu.setdefault(node, []).extend(one.get("gpu_problems") or [])
    flagged = scores.flag_nodes(
        compute, allreduce, read, gpu, margin=margin, mad_k=mad_k, network_margin=network_margin
    )
    nodes = list(dict.fromkeys(names[rank] for rank in sorted(names)))
    ring = [float(one["ring_mb_s"]) for one in ranks if isinstance(one.get("ring_mb_s"), (int, float))]
    return BurnIn(
        nodes=nodes,
        ring_mb_s=min(ring) if ring else None,
        bucket_mb=BUCKET_MB,
        scores=[
            NodeScore(
                node=node,
                compute_ms=compute.get(node),
                allreduce_mb_s=allreduce.get(node),
                read_mb_s=read.get(node),
                gpu_problems=gpu.get(node, []),
                flagged=node in flagged,
                reason=flagged.get(node),
            )
            for node in nodes
        ],
        flagged=[node for node in nodes if node in flagged],
    )


def run_burn_in(
    ctx: TaskContext, *, exit_process: Callable[[int], object], plain: PlainGroup | None = None
) -> BurnIn | None:
    """Probe, score, and act (module docstring); returns the verdict when training may start. ``plain``: a
    CPU script's group (no torch); else the default process group (none: no burn-in)."""
    if os.environ.get(BURN_IN_VAR) == "off":
        return None
    if plain is not None:
        group: Group = plain
        kit: Kit = plain_probes.PlainKit(plain)
    else:
        import torch.distributed as dist

        from hpctrain.healing.probes import TorchGroup, TorchKit

        if not dist.is_initialized():
            return None
        group, kit = TorchGroup(), TorchKit(ctx)
    env = ctx.env
    heartbeat.set_phase("burn-in")
    try:
        record = probe(ctx, group, kit)
    finally:
        kit.close()
    heartbeat.set_phase("setup")
    _say(env.is_main, record)
    if not record.flagged:
        if env.is_main:
            _write(ctx, record)
        return record
    if os.environ.get(STEP_ID_VAR):  # the supervisor decides
        if env.is_main:
            record.action = "supervisor decides"
            _write(ctx, record)
        group.barrier()  # the record is written before any rank exits (srun then ends the step at once)
        _leave(exit_process, BURN_IN_EXIT)
        return None
    action = decide_here(ctx, record) if env.is_main else None
    if group.broadcast(action) == "requeue":
        _leave(exit_process, 0)  # no result: the job comes back without the node
        return None
    return record


def probe(ctx: TaskContext, group: Group, kit: Kit) -> BurnIn:
    """Every rank probes, rank 0 scores; every rank gets the verdict (collective: all ranks call it)."""
    env, settings = ctx.env, ctx.spec.health.burn_in
    started = time.perf_counter()
    layout = group.all_gather([env.global_rank, env.node_rank, env.node_name or env.hostname])
    names = {rank: name for rank, _, name in layout}
    node_ranks = sorted({node_rank for _, node_rank, _ in layout})
    leaders = [min(rank for rank, nr, _ in layout if nr == k) for k in node_ranks]
    prober = Prober(ctx, kit, node_ranks.index(env.node_rank), len(node_ranks), leaders)
    prober.setup()
    passes: list[dict[str, Any]] = []
    verdict: Any = None
    for number in range(PASSES):
        passes.append(prober.measure(time.perf_counter() + settings.budget_s / PASSES, confirming=number > 0))
        gathered = group.all_gather(best_of(passes))
        if env.is_main:
            record = assess(gathered, names, settings.margin, settings.mad_k, settings.network_margin)
            record.job_id, record.step_id, record.passes = env.job_id, os.environ.get(STEP_ID_VAR), number + 1
            record.seconds, record.time = round(time.perf_counter() - started, 2), round(time.time(), 3)
            record.phases_s = dict(prober.phases)
            verdict = record.model_dump(mode="json")
        if not group.broadcast(bool(env.is_main and verdict["flagged"])):  # every rank measures again, or none
            break
    return BurnIn.model_validate(group.broadcast(verdict))


def decide_here(ctx: TaskContext, record: BurnIn) -> str:
    """Rank 0 of a job without a supervisor: the one decider's answer, carried out by the one executor."""
    from hpctrain.healing.record import HealRecord

    heal = HealRecord(ctx.run_dir, ctx.spec, os.environ, say=log.warning)
    blamed = [decide.Blame(s.node, s.reason or "flagged", kind="burn-in") for s in record.scores if s.flagged]
    situation = heal.situation(
        blamed,
        step_nodes=record.nodes,
        allocation=record.nodes,  # only nodes here: no spare, no min_nodes below it
        can_requeue=heal.can_requeue and ctx.env.under_slurm,
        ranks_alive=True,  # the ranks train on the flagged nodes if Slurm refuses the requeue
    )
    evidence = {s.node: s.model_dump(exclude={"node", "flagged"}) for s in record.scores if s.flagged}
    decision = heal.carry_out(situation, decide.decide(situation), evidence)
    record.action = decision.action
    _write(ctx, record)
    return decision.action


def _write(ctx: TaskContext, record: BurnIn) -> None:
    summary = read_summary(ctx.run_dir)
    fields = summary.fields() if summary is not None else {}
    fields[BURN_IN_KEY] = appended(fields.get(BURN_IN_KEY), record.model_dump(mode="json"))
    try:
        write_summary(ctx.run_dir, fields)
    except OSError as exc:
        log.warning("could not record the burn-in in summary.json: %s", exc)


def _say(main: bool, record: BurnIn) -> None:
    if not main:
        return
    shown = ", ".join(
        f"{s.node} {s.compute_ms or 0:.0f} ms/{s.allreduce_mb_s or 0:.0f} MB/s/{s.read_mb_s or 0:.0f} MB/s"
        for s in record.scores
    )
    flagged = "; ".join(f"{s.node}: {s.reason}" for s in record.scores if s.flagged) or "none flagged"
    log.info("burn-in in %.1f s (compute/pair all-reduce/read): %s; %s", record.seconds or 0, shown, flagged)


def _leave(exit_process: Callable[[int], object], status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    torch = sys.modules.get("torch")  # a torch kit's queued work is done before the process ends
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
    exit_process(status)
