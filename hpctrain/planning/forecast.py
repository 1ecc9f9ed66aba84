"""A submitted run's expected start and finish, said once it is queued, and later checked against what happened.

``hpctrain submit`` asks :func:`forecast` right after Slurm took the job: the
work and step time come from the same places as ``hpctrain plan`` (this
spec's earlier runs, ``work.py``, ``step_time.py``), the start from Slurm's
own answer for the queued job (``squeue``'s start, or the job already
running), else from ``sbatch --test-only`` with the job's options, and the
finish from the plan's timeline (``timeline.py``): chunks of the time limit,
each paying a restart and, after the first, the queue again. What is not
known stays None, and ``basis`` says why; a forecast never fails a submit.

The forecast is recorded in the run (``contract/estimates.py``), and
:func:`compare` sets the first record against the run's real start and end
(summary.json): ``hpctrain report`` and ``status --watch`` show it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.contract.slurm import Slurm
from hpctrain.contract.slurm_states import is_pending
from hpctrain.errors import ClusterError, UsageError
from hpctrain.jobspec.slurm_time import seconds_to_minutes
from hpctrain.planning.cluster import requeue_hold, start_of, test_only_options
from hpctrain.planning.history import history
from hpctrain.planning.restart_cost import restart_cost
from hpctrain.planning.step_time import step_times
from hpctrain.planning.timeline import duration, timeline, with_hold
from hpctrain.planning.work import work_of

if TYPE_CHECKING:
    from hpctrain.contract.summary import Summary
    from hpctrain.jobspec.load import LoadedJob

ISO = "%Y-%m-%dT%H:%M:%S%z"
SUBMIT_RUNS = 8  # earlier runs a submit reads (plan reads 64): the newest say the most, and submit stays quick


@dataclass(frozen=True)
class Forecast:
    """When a just-submitted run is expected to start and finish (epoch seconds; None: not known, see ``basis``)."""

    made_at: float
    start_at: float | None
    finish_at: float | None
    steps: int | None
    step_s: float | None
    chunks: int | None
    basis: str
    by: str = "submit"

    def lines(self) -> list[str]:
        """What ``submit`` prints under the run dir."""
        start = "unknown" if self.start_at is None else _when(self.start_at, self.made_at)
        finish = "unknown" if self.finish_at is None else _when(self.finish_at, self.made_at)
        return [f"  expected start:  {start}", f"  expected finish: {finish}", f"  estimate:        {self.basis}"]

    def record(self) -> dict[str, Any]:
        """The entry kept in ``RUN/.hpctrain/estimates.json``."""
        return {
            "by": self.by,
            "made_at": self.made_at,
            "start_at": self.start_at,
            "finish_at": self.finish_at,
            "expected_start": _iso(self.start_at),
            "expected_finish": _iso(self.finish_at),
            "steps": self.steps,
            "step_s": self.step_s,
            "chunks": self.chunks,
            "basis": self.basis,
        }


def forecast(
    job: LoadedJob,
    job_id: str,
    slurm: Slurm,
    *,
    by: str = "submit",
    steps_done: int = 0,
    clock: Callable[[], float] = time.time,
) -> Forecast:
    """The queued run's expected start and finish, from the plan's sources; at most two Slurm calls.

    ``steps_done``: steps the run already kept (a resume trains the rest)."""
    now, spec, notes = clock(), job.spec, []
    spec_home = Path(spec.output_dir).expanduser() / spec.name
    found = history(spec_home, spec.model_dump(mode="json"), max_runs=SUBMIT_RUNS)
    try:
        work = work_of(
            spec_name=spec.name,
            runs_trainer=spec.runs_trainer,
            epochs=spec.trainer.epochs,
            max_steps_per_epoch=spec.trainer.max_steps_per_epoch,
            measured_samples=found.samples_per_epoch,
            measured_total_steps=found.total_steps,
        )
        steps: int | None = max(0, work.steps_at(spec.global_batch_size) - steps_done)
    except UsageError:
        steps = None
        notes.append("steps not known (no earlier run of this spec recorded them)")
    nodes = spec.resources.nodes
    step = step_times((nodes,), found.measurements)[nodes]
    if step is None:
        notes.append("no step time: no earlier run of this spec logged one (hpctrain status RUN has it once it trains)")
    start_in, start_from = _start_in(job, job_id, slurm, now, clock)
    notes.insert(0, start_from)
    finish_in = chunks = None
    if steps is not None and step is not None:
        restart = restart_cost(found)
        line = timeline(
            steps=steps,
            step_s=step.seconds,
            nodes=nodes,
            gpus_per_node=spec.resources.gpus_per_node or 0,
            limit_s=spec.resources.time_s,
            stop_s=spec.signals.signal_delay_s,
            start_in_s=start_in,
            restart_s=restart.seconds,
        )
        hold_s = 0.0
        if line.chunks > 1:  # only then one more Slurm call: how long each requeued chunk is held
            hold_s, _why = requeue_hold(spec.resources.expedited_requeue, slurm)
            line = with_hold(line, hold_s)
        finish_in, chunks = line.finish_in_s, line.chunks
        notes.append(
            f"{steps:,} steps at {step.seconds:.3g} s ({step.source}), {chunks} chunk(s) of {spec.resources.time}"
            f"{f', each later one held {hold_s:.0f} s after its requeue, then queued as long' if chunks > 1 else ''}"
            f", {restart.seconds:.0f} s start-up each "
            f"({'measured' if restart.measured else 'assumed'})"
        )
    return Forecast(
        now,
        None if start_in is None else now + start_in,
        None if finish_in is None else now + finish_in,
        steps,
        None if step is None else step.seconds,
        chunks,
        "; ".join(notes),
        by,
    )


def _start_in(
    job: LoadedJob, job_id: str, slurm: Slurm, now: float, clock: Callable[[], float]
) -> tuple[float | None, str]:
    """Seconds to the start and where that came from: the queued job's own estimate, else ``--test-only``."""
    try:
        times = slurm.job_times(job_id)
    except ClusterError:
        times = None
    if times is not None and times.state == "RUNNING":
        return 0.0, "start: running already"
    if times is not None and is_pending(times.state) and times.start is not None:
        return max(0.0, times.start.timestamp() - now), "start: Slurm's own estimate for the queued job"
    asked = start_of(slurm, test_only_options(job, seconds_to_minutes(job.spec.resources.time_s)), clock)
    if asked.in_s is not None:
        return asked.in_s, "start: sbatch --test-only (Slurm had not planned the queued job yet)"
    return None, f"start: not known yet ({asked.unknown or asked.never or 'Slurm gave none'})"


@dataclass(frozen=True)
class Outcome:
    """The first estimate against what happened (epoch seconds); ``error``: the finish's error relative to the
    time from the estimate to the real finish (0.1 = 10 % late or early)."""

    made_at: float
    predicted_start: float | None
    actual_start: float | None
    predicted_finish: float | None
    actual_finish: float | None

    @property
    def error(self) -> float | None:
        if self.predicted_finish is None or self.actual_finish is None or self.actual_finish <= self.made_at:
            return None
        return (self.predicted_finish - self.actual_finish) / (self.actual_finish - self.made_at)

    def line(self) -> str:
        """One line: predicted vs real start and finish, and the finish's error."""
        start = f"start: predicted {_iso(self.predicted_start) or 'unknown'}, real {_iso(self.actual_start) or '-'}"
        finish = f"finish: predicted {_iso(self.predicted_finish) or 'unknown'}, real {_iso(self.actual_finish) or '-'}"
        if (error := self.error) is not None and self.actual_finish is not None:
            span = duration(self.actual_finish - self.made_at)
            finish += f" (predicted {abs(error):.0%} {'late' if error > 0 else 'early'} over the {span} to it)"
        return f"{start}; {finish}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "estimated_at": _iso(self.made_at),
            "predicted_start": _iso(self.predicted_start),
            "actual_start": _iso(self.actual_start),
            "predicted_finish": _iso(self.predicted_finish),
            "actual_finish": _iso(self.actual_finish),
            "finish_error": self.error,
        }


def compare(entries: list[dict[str, Any]], summary: Summary | None) -> Outcome | None:
    """The first recorded estimate (``contract/estimates.py``) against the run's summary; None without one."""
    first = entries[0] if entries else None
    made_at = _number(first.get("made_at")) if first else None
    if first is None or made_at is None:
        return None
    started = _parse(summary.started_at) if summary is not None else None
    finished = _parse(summary.updated_at) if summary is not None and summary.status == "completed" else None
    return Outcome(made_at, _number(first.get("start_at")), started, _number(first.get("finish_at")), finished)


def recorded_line(entries: list[dict[str, Any]]) -> str:
    """The newest recorded estimate as one line (what ``status --watch`` shows before it asks Slurm)."""
    newest = entries[-1] if entries else {}
    start, finish = _number(newest.get("start_at")), _number(newest.get("finish_at"))
    if start is None and finish is None:
        return ""
    made = _number(newest.get("made_at"))
    by = newest.get("by") if newest.get("by") in ("submit", "resume") else "submit"
    return (
        f"expected start {_iso(start) or 'unknown'}, expected finish {_iso(finish) or 'unknown'} "
        f"(as estimated at {by}, {_iso(made) or '?'})"
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _parse(text: str | None) -> float | None:
    try:
        return datetime.strptime(text, ISO).timestamp() if isinstance(text, str) else None
    except ValueError:
        return None


def _iso(when: float | None) -> str | None:
    return None if when is None else time.strftime(ISO, time.localtime(when))


def _when(at: float, now: float) -> str:
    ahead = at - now
    return f"{_iso(at)} ({'now' if ahead < 60 else 'in ' + duration(ahead)})"
