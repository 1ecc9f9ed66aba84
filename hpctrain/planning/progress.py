"""A queued or running run's expected start and finish: ``hpctrain status RUN`` asks here, and the
numbers come from the plan's own timeline (``timeline.py``), so status and plan agree.

Queued: the start is Slurm's own estimate for the job (``squeue``'s start
time, which the scheduler sets once it has planned the job), and the finish
is that start plus the steps left at the run's own step time, in chunks of
its time limit. Running: the finish is now plus the steps left, when they fit
in the time the job has left; a run that needs more chunks gets the earliest
it can finish (``finish_at_least``) and the chunks left, since the queue wait
of a chunk not yet queued is not Slurm's to say. Whatever is not known --
no step logged yet, a start the scheduler has not set -- stays None, and
``basis`` says why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_states import is_pending
from hpctrain.contract.summary import read_summary
from hpctrain.errors import ClusterError
from hpctrain.jobspec.slurm_time import parse_time_limit
from hpctrain.planning.cluster import requeue_hold
from hpctrain.planning.history import dotted, read_run_spec, run_pace
from hpctrain.planning.timeline import duration, timeline, with_hold


@dataclass(frozen=True)
class Estimate:
    """What ``status`` shows of a queued or running run's future (ISO times; None: not known, see ``basis``)."""

    expected_start: str | None
    expected_finish: str | None
    finish_at_least: str | None  # a run with chunks still to queue: the earliest it can finish
    steps_left: int | None
    chunks_left: int | None  # chunks after the current one (queued: including the first)
    basis: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for ``status --watch``: the start while queued, the finish (or its lower bound)."""
        parts = [f"expected start {self.expected_start}"] if self.expected_start else []
        if self.expected_finish:
            parts.append(f"expected finish {self.expected_finish}")
        elif self.finish_at_least:
            parts.append(f"finish not before {self.finish_at_least} (+ {self.chunks_left} chunk(s)' queue waits)")
        else:
            parts.append("finish not known yet")
        return f"{', '.join(parts)} ({self.basis})" if self.basis else ", ".join(parts)


def estimate(run_dir: Path, job_id: str, slurm: Slurm, *, clock: Callable[[], float] = time.time) -> Estimate | None:
    """The run's expected start and finish while Slurm holds its job queued or running; None otherwise."""
    try:
        times = slurm.job_times(job_id)
    except ClusterError:
        return None
    if times is None or not (is_pending(times.state) or times.state == "RUNNING"):
        return None
    now, notes = clock(), []
    summary = read_summary(run_dir)
    total = None
    if summary is not None:
        total = summary.total_steps or (
            summary.epochs * summary.steps_per_epoch if summary.epochs and summary.steps_per_epoch else None
        )
    steps_left = None if total is None else max(0, total - (summary.global_step or 0 if summary else 0))
    pace = run_pace(run_dir)  # wall time per step: what the run does between steps counts too
    step_s = None if pace is None else pace.seconds
    spec = read_run_spec(run_dir) or {}
    limit_s, stop_s = times.time_limit_s or _limit_s(spec), dotted(spec, "signals.signal_delay_s")
    stop_s = stop_s if isinstance(stop_s, int) else 0
    if steps_left is None:
        notes.append("the run's steps are not known until it starts ('hpctrain plan SPEC' estimates them)")
    if step_s is None:
        notes.append("no step logged yet: the finish is known once the run has trained")
    if is_pending(times.state):
        start_in = None if times.start is None else max(0.0, times.start.timestamp() - now)
        if start_in is None:
            notes.append("Slurm has not planned the job's start yet")
        else:
            notes.append("start: Slurm's own estimate for the queued job")
        finish = chunks = None
        if steps_left is not None and step_s is not None and limit_s is not None and start_in is not None:
            line = timeline(
                steps=steps_left,
                step_s=step_s,
                nodes=1,
                gpus_per_node=0,
                limit_s=limit_s,
                stop_s=stop_s,
                start_in_s=start_in,
            )
            hold_s = _hold_s(spec, slurm) if line.chunks > 1 else 0.0
            line = with_hold(line, hold_s)
            finish, chunks = line.finish_in_s, line.chunks
            notes.append(
                f"finish: {steps_left:,} steps at {step_s:.3g} s, {chunks} chunk(s), each later one "
                + (f"held {hold_s:.0f} s after its requeue, then " if hold_s else "")
                + "queued as long"
            )
        return Estimate(_iso(now, start_in), _iso(now, finish), None, steps_left, chunks, "; ".join(notes))
    # running: the rest of this chunk, then chunks still to queue
    if steps_left is None or step_s is None or times.time_left_s is None:
        if times.time_left_s is None:
            notes.append("Slurm gave no time left for the job")
        return Estimate(None, None, None, steps_left, None, "; ".join(notes))
    train_s = steps_left * step_s
    now_useful = max(0.0, times.time_left_s - stop_s)
    if train_s <= now_useful:
        basis = (
            f"{steps_left:,} steps left at {step_s:.3g} s (this run's median logged step) fit in this job's time left"
        )
        return Estimate(None, _iso(now, train_s), None, steps_left, 0, basis)
    if limit_s is None:
        return Estimate(None, None, None, steps_left, None, "the run's time limit is unknown (no readable spec.yaml)")
    rest = timeline(
        steps=math.ceil((train_s - now_useful) / step_s),
        step_s=step_s,
        nodes=1,
        gpus_per_node=0,
        limit_s=limit_s,
        stop_s=stop_s,
        start_in_s=0.0,
    )
    hold_s = _hold_s(spec, slurm)
    at_least = times.time_left_s + rest.held_s + rest.chunks * hold_s
    basis = (
        f"{steps_left:,} steps left at {step_s:.3g} s: this job's {duration(times.time_left_s)} and {rest.chunks} more "
        f"chunk(s), each held {hold_s:.0f} s after its requeue; at least {duration(at_least)}, plus each chunk's "
        "queue wait (not known before it is queued)"
    )
    return Estimate(None, None, _iso(now, at_least), steps_left, rest.chunks, basis)


def _limit_s(spec: dict[str, Any]) -> int | None:
    value = dotted(spec, "resources.time")
    try:
        return parse_time_limit(value) if isinstance(value, (str, int)) else None
    except ValueError:
        return None


def _iso(now: float, in_s: float | None) -> str | None:
    return None if in_s is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(now + in_s))


def _hold_s(spec: dict[str, Any], slurm: Slurm) -> float:
    """Slurm's hold of each requeued chunk of this run (planning/cluster.py), from its resolved spec."""
    expedited = dotted(spec, "resources.expedited_requeue")
    return requeue_hold(expedited if isinstance(expedited, bool) or expedited == "auto" else False, slurm)[0]
