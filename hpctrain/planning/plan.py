"""The plan: for each shape, when it starts, how long it trains, when it finishes, what it costs; and the pick.

:func:`plan` is the one sequence both faces call (``hpctrain plan`` prints
it, ``hpctrain.plan`` returns it): read the spec, its earlier runs, the work,
then ask Slurm about each shape, then put each on a timeline and choose.
Library errors are the project's own (``SpecError``, ``UsageError`` with what
is missing); what only Slurm could say and did not is an ``unknown`` in the
shape's row and a note, never a number.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpctrain.contract.slurm import Slurm
from hpctrain.errors import SpecError, UsageError
from hpctrain.jobspec.slurm_time import seconds_to_minutes
from hpctrain.planning.cluster import Partition, Start, find_partition, requeue_hold, start_of, test_only_options
from hpctrain.planning.history import History, history
from hpctrain.planning.restart_cost import RestartCost, restart_cost
from hpctrain.planning.step_time import StepTime, step_times
from hpctrain.planning.timeline import DEFAULT_MARGIN, Choice, Timeline, duration, recommend, timeline
from hpctrain.planning.work import Work, work_of

if TYPE_CHECKING:
    from hpctrain.jobspec.load import LoadedJob

DEFAULT_SHAPES = (1, 2, 4, 8)
MAX_SHAPES = 16
MAX_NODES = 4096  # the spec's own bound on resources.nodes
COLUMNS = ("nodes", "GPUs", "steps", "step time", "starts in", "chunks", "finishes in", "node-h", "GPU-h")
COLUMNS += ("dominates", "source")


@dataclass(frozen=True)
class ShapePlan:
    """One node count: its work, step time, start and timeline, or the ``problem`` that rules it out."""

    nodes: int
    gpus: int
    global_batch: int | None = None
    steps: int | None = None
    step_time: StepTime | None = None
    start: Start = Start()
    timeline: Timeline | None = None
    problem: str = ""


@dataclass(frozen=True)
class Plan:
    spec: str
    name: str
    partition: Partition | None
    limit_s: int  # one chunk's time limit
    limit_source: str
    work: Work
    shapes: tuple[ShapePlan, ...]
    choice: Choice
    margin: float
    restart_s: float
    notes: tuple[str, ...] = field(default=())
    made_at: float = 0.0
    restart: RestartCost | None = None  # where restart_s comes from (restart_cost.py)

    def as_json(self) -> dict[str, Any]:
        """What ``hpctrain plan --json`` prints: every number with its source; unknowns as null and a reason."""
        return {
            "spec": self.spec,
            "name": self.name,
            "made_at": _iso(self.made_at),
            "partition": None if self.partition is None else self.partition.__dict__,
            "chunk_limit_s": self.limit_s,
            "chunk_limit_source": self.limit_source,
            "restart_s": self.restart_s,
            "restart": None if self.restart is None else self.restart.as_json(),
            "work_source": self.work.source,
            "shapes": [_shape_json(shape, self.made_at) for shape in self.shapes],
            "recommended_nodes": self.choice.nodes,
            "reason": self.choice.reason,
            "margin": self.margin,
            "notes": list(self.notes),
        }


def parse_shapes(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8): whole node counts 1..4096, at most 16, duplicates dropped; else UsageError."""
    parts = [part.strip() for part in str(text).split(",")]
    if not parts or any(not part for part in parts):
        raise UsageError(f"--nodes {text!r}: give node counts separated by commas", hint="--nodes 1,2,4,8")
    shapes: list[int] = []
    for part in parts:
        if not part.isdigit() or not 1 <= int(part) <= MAX_NODES:
            raise UsageError(
                f"--nodes {text!r}: {part!r} is not a node count from 1 to {MAX_NODES}", hint="--nodes 1,2,4,8"
            )
        if int(part) not in shapes:
            shapes.append(int(part))
    if len(shapes) > MAX_SHAPES:
        raise UsageError(f"--nodes: {len(shapes)} shapes; a plan compares at most {MAX_SHAPES}", hint="--nodes 1,2,4,8")
    return tuple(sorted(shapes))


def plan(
    spec: str | Path,
    *,
    nodes: Sequence[int] | None = None,
    overrides: Sequence[str] = (),
    cluster: str | None = None,
    steps: int | None = None,
    samples_per_epoch: int | None = None,
    step_time_s: float | None = None,
    step_time_nodes: int | None = None,
    margin: float = DEFAULT_MARGIN,
    restart_s: float | None = None,
    measure_steps: int | None = None,
    submit: Callable[..., Any] | None = None,
    slurm: Slurm | None = None,
    clock: Callable[[], float] = time.time,
) -> Plan:
    """The plan of ``spec`` at each of ``nodes`` (default: 1, 2, 4, 8 that the partition holds, and the spec's).
    ``measure_steps``: first run the spec cut down to one node and that many steps, and wait (``measure.py``),
    through ``submit``: the submit sequence (``launch.submit.submit``), which the faces hand down because
    planning stands beneath launch (launch's submit records a forecast made here).
    ``restart_s``: each chunk's start-up; None: measured by the spec's earlier runs, else assumed (restart_cost.py)."""
    from hpctrain.jobspec.load import load_job

    job = load_job(spec, overrides, cluster=cluster)
    res, notes = job.spec.resources, []
    if measure_steps is not None:
        from hpctrain.planning.measure import measure

        if submit is None:
            raise TypeError("plan(measure_steps=...) needs submit= (launch.submit.submit) to run the measurement")
        measured = measure(spec, overrides=overrides, cluster=cluster, steps=measure_steps, submit=submit)
        notes.append(
            f"--measure: job {measured.job_id} ran {measured.steps} step(s) at 1 node ({measured.state}), in "
            f"{measured.run_dir}" + ("" if measured.step_s is None else f": median step {measured.step_s:.3g} s")
        )
    if job.is_study or job.spec.sweep:
        notes.append("a study or sweep spec: planned as its base spec (each point is its own run)")
    spec_home = Path(job.spec.output_dir).expanduser() / job.spec.name
    found = history(spec_home, job.spec.model_dump(mode="json"))
    notes += found.notes
    restart = restart_cost(found, restart_s)
    work = work_of(
        spec_name=str(spec),
        runs_trainer=job.spec.runs_trainer,
        epochs=job.spec.trainer.epochs,
        max_steps_per_epoch=job.spec.trainer.max_steps_per_epoch,
        steps=steps,
        samples_per_epoch=samples_per_epoch,
        measured_samples=found.samples_per_epoch,
        measured_total_steps=found.total_steps,
    )
    slurm = slurm if slurm is not None else Slurm()
    local = job.profile.scheduler == "local"
    here = not local and slurm.available()
    partition, why = find_partition(slurm, res.partition) if here else (None, "")
    if why:
        notes.append(why)
    if local:
        notes.append(
            f"cluster profile {job.profile.name!r} runs on this machine: a run starts when submitted, and every "
            "node's tasks share this machine (more nodes are not faster here)"
        )
    elif not here:
        notes.append("no Slurm on this machine: start times are unknown; run 'hpctrain plan' on a login node")
    limit_s, limit_source = res.time_s, f"resources.time {res.time}"
    if partition is not None and partition.max_time_s is not None and partition.max_time_s < limit_s:
        limit_s, limit_source = partition.max_time_s, f"partition {partition.name}'s MaxTime (below resources.time)"
        notes.append(
            f"resources.time {res.time} is above {partition.name}'s MaxTime: submit refuses it; "
            "planned as chunks of MaxTime"
        )
    if res.time_min is not None:
        notes.append(
            f"resources.time_min {res.time_min}: Slurm may start a chunk sooner with a limit down to it (asked so by "
            "--test-only); planned at the full limit, and each shorter chunk adds a restart"
        )
    shapes = tuple(nodes) if nodes else (res.nodes,) if local else _default_shapes(res.nodes, partition)
    times = step_times(shapes, found.measurements, user_step_s=step_time_s, user_nodes=step_time_nodes or res.nodes)
    if all(value is None for value in times.values()):
        raise UsageError(
            f"{spec}: no step time: no earlier run of this spec under {spec_home} logged one",
            hint="give --step-time SECONDS (one optimizer step at the spec's node count), or --measure (runs it "
            "at 1 node for 40 steps first), or run the spec once",
        )
    asker: Slurm | Literal["local"] | None = "local" if local else slurm if here else None
    hold_s, hold_why = requeue_hold(res.expedited_requeue, slurm if here else None)
    context = _Context(
        job, spec, tuple(overrides), cluster, work, partition, limit_s, restart.seconds, asker, clock, hold_s
    )
    rows = [_shape(context, count, times[count]) for count in shapes]
    _history_note(found, notes)
    if any(t is not None and t.model == "step split" for t in times.values()):
        splits = sum(1 for m in found.measurements if m.scale is not None)
        notes.append(
            f"shapes no run measured: the report's what-if model over the step_split records of {splits} earlier "
            "run(s) (docs/scaling.md); 'dominates' is what would lose the most there"
        )
    notes.append(f"each chunk spends {restart.seconds:.0f} s starting before it trains: {restart.source}")
    if any(row.timeline is not None and row.timeline.chunks > 1 for row in rows):
        notes.append(
            f"each chunk after the first is held {hold_s:.0f} s after its requeue ({hold_why}), then taken to "
            "wait in the queue as long as the first start does now"
        )
    if any(row.start.unknown for row in rows):
        notes.append("a start Slurm did not give is shown as unknown, and so is that shape's finish")
    choice = recommend([(row.nodes, row.timeline) for row in rows if row.timeline is not None], margin)
    if choice.nodes is None and any(row.timeline for row in rows):
        fastest = min((row for row in rows if row.timeline), key=lambda row: row.timeline.held_s if row.timeline else 0)
        choice = Choice(None, f"{choice.reason}; by its own run time alone, {fastest.nodes} node(s) is shortest")
    return Plan(
        str(spec),
        job.spec.name,
        partition,
        limit_s,
        limit_source,
        work,
        tuple(rows),
        choice,
        margin,
        restart.seconds,
        tuple(notes),
        clock(),
        restart,
    )


@dataclass(frozen=True)
class _Context:
    """What every shape of one plan is planned with."""

    job: LoadedJob
    spec: str | Path
    overrides: tuple[str, ...]
    cluster: str | None
    work: Work
    partition: Partition | None
    limit_s: int
    restart_s: float
    slurm: Slurm | Literal["local"] | None  # "local": runs here, starts now; None: no Slurm on this machine
    clock: Callable[[], float]
    requeue_hold_s: float = 0.0  # Slurm's hold of a requeued job before its next chunk may start


def _shape(context: _Context, count: int, step_time: StepTime | None) -> ShapePlan:
    """One shape's row: ruled out by the partition, the spec or Slurm, or put on its timeline."""
    from hpctrain.jobspec.load import load_job

    job, partition, slurm = context.job, context.partition, context.slurm
    gpus_per_node = job.spec.resources.gpus_per_node or 0
    gpus = count * gpus_per_node
    if partition is not None:
        for limit, what in ((partition.total_nodes, "has"), (partition.max_nodes, "allows a job at most")):
            if limit is not None and count > limit:
                return ShapePlan(count, gpus, problem=f"partition {partition.name} {what} {limit} nodes")
    try:
        shaped = load_job(context.spec, [*context.overrides, f"resources.nodes={count}"], cluster=context.cluster)
    except SpecError as exc:
        first = exc.problems[0].message if exc.problems else exc.message
        return ShapePlan(count, gpus, problem=f"resources.nodes={count}: {first}")
    batch = shaped.spec.global_batch_size
    total = context.work.steps_at(batch)
    if slurm == "local":
        start = Start(in_s=0.0, nodes="this machine")
    elif slurm is None:
        start = Start(unknown="no Slurm on this machine")
    else:
        start = start_of(slurm, test_only_options(shaped, seconds_to_minutes(context.limit_s)), context.clock)
    if start.never:
        return ShapePlan(count, gpus, batch, total, step_time, start, problem=start.never)
    if step_time is None:
        return ShapePlan(count, gpus, batch, total, None, start, problem="no step time")
    line = timeline(
        steps=total,
        step_s=step_time.seconds,
        nodes=count,
        gpus_per_node=gpus_per_node,
        limit_s=context.limit_s,
        stop_s=job.spec.signals.signal_delay_s,
        start_in_s=start.in_s,
        restart_s=context.restart_s,
        requeue_hold_s=context.requeue_hold_s,
    )
    return ShapePlan(count, gpus, batch, total, step_time, start, line)


def _default_shapes(own: int, partition: Partition | None) -> tuple[int, ...]:
    most = partition.total_nodes if partition is not None and partition.total_nodes else None
    return tuple(sorted({n for n in DEFAULT_SHAPES if most is None or n <= most} | {own}))


def _history_note(found: History, notes: list[str]) -> None:
    if found.measurements:
        notes.append(f"step times measured by {len(found.measurements)} earlier run(s) of this spec")
    else:
        notes.append(f"no earlier run of this spec measured a step time ({found.looked_at} run folder(s) looked at)")


def shape_cells(shape: ShapePlan) -> tuple[str, ...]:
    """One row of the plan's table (:data:`COLUMNS`)."""
    line, step = shape.timeline, shape.step_time
    gpus = str(shape.gpus) if shape.gpus else "-"
    steps = f"{shape.steps:,}" if shape.steps is not None else "?"
    step_text = "?" if step is None else f"{step.seconds:.3g} s" + (" (extrap.)" if step.extrapolated else "")
    dominates = (step.dominates() if step is not None else "") or "-"
    if shape.problem:
        return (
            str(shape.nodes),
            gpus,
            steps,
            step_text,
            "-",
            "-",
            "-",
            "-",
            "-",
            dominates,
            f"cannot plan: {shape.problem}",
        )
    assert line is not None and step is not None
    starts = "unknown" if line.start_in_s is None else "now" if line.start_in_s < 60 else duration(line.start_in_s)
    finish = "unknown" if line.finish_in_s is None else duration(line.finish_in_s)
    gpu_hours = "-" if line.gpu_hours is None else f"{line.gpu_hours:.1f}"
    source = step.source if not shape.start.unknown else f"{step.source}; start: {shape.start.unknown}"
    return (
        str(shape.nodes),
        gpus,
        steps,
        step_text,
        starts,
        str(line.chunks),
        finish,
        f"{line.node_hours:.1f}",
        gpu_hours,
        dominates,
        source,
    )


def _shape_json(shape: ShapePlan, now: float) -> dict[str, Any]:
    line, step = shape.timeline, shape.step_time
    return {
        "nodes": shape.nodes,
        "gpus": shape.gpus,
        "global_batch": shape.global_batch,
        "steps": shape.steps,
        "step_s": None if step is None else step.seconds,
        "step_source": None if step is None else step.source,
        "extrapolated": None if step is None else step.extrapolated,
        "step_model": None if step is None else step.model,
        "dominant": None if step is None else step.dominant,
        "dominant_loss": None if step is None else step.dominant_loss,
        "start_in_s": shape.start.in_s,
        "expected_start": None if shape.start.in_s is None else _iso(now + shape.start.in_s),
        "start_unknown": shape.start.unknown or None,
        "slurm_nodes": shape.start.nodes or None,
        "chunks": None if line is None else line.chunks,
        "train_s": None if line is None else line.train_s,
        "held_s": None if line is None else line.held_s,
        "finish_in_s": None if line is None else line.finish_in_s,
        "expected_finish": None if line is None or line.finish_in_s is None else _iso(now + line.finish_in_s),
        "node_hours": None if line is None else line.node_hours,
        "gpu_hours": None if line is None else line.gpu_hours,
        "problem": shape.problem or None,
    }


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(when))
