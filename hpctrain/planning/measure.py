"""``hpctrain plan --measure``: a short run of the spec itself, so that the plan has a measured step time.

Where no earlier run of the spec logged a step time (and the user gives no
``--step-time``), the plan has nothing to go on. ``--measure`` submits the
spec as it is (its model, batch, precision and input pipeline, on its
partition) cut down to one node and :data:`MEASURE_STEPS` optimizer steps
(``trainer.epochs=1``, ``trainer.max_steps_per_epoch``), through the one
submit sequence (``launch/submit.py``: the same checks, script and run
directory; the faces hand it down as ``submit``, since planning stands
beneath launch), and waits for it. Its run directory lies under the spec's own
``OUTPUT_DIR/NAME``, so the plan's history (``history.py``) reads its step
times as any earlier run's: measured at one node, the other shapes
extrapolated from it and marked so. The first steps (warm-up) weigh little:
the plan takes the median.

Only the built-in trainer's spec can be cut down so; a ``script:`` or
``entrypoint:`` counts its own steps (run it once instead, or give
``--step-time``). Login side, torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import RunDirError, UsageError

MEASURE_STEPS = 40
MEASURE_TIME = "00:20:00"  # the measurement's time limit: start-up, the steps, the save


@dataclass(frozen=True)
class Measured:
    """The measurement run: where it is, its job, how it ended, its median logged step time and how many."""

    run_dir: Path
    job_id: str | None
    state: str | None
    step_s: float
    steps: int


def measurement_overrides(steps: int = MEASURE_STEPS) -> list[str]:
    """The spec cut down to one node and ``steps`` steps, never healed, synced or requeued for long."""
    return [
        "resources.nodes=1",
        "resources.min_nodes=null",
        "resources.spare_nodes=0",
        f"resources.time={MEASURE_TIME}",
        "resources.time_min=null",
        "trainer.epochs=1",
        f"trainer.max_steps_per_epoch={steps}",
        "tracking.live=false",
    ]


def measure(
    spec: str | Path,
    *,
    overrides: Sequence[str] = (),
    cluster: str | None = None,
    steps: int = MEASURE_STEPS,
    submit: Callable[..., Any],
) -> Measured:
    """Run the cut-down spec through ``submit`` (``launch.submit.submit``, or its stand-in) and wait for it; its
    step time is then in the spec's history. Raises UsageError
    for a spec that is not the trainer's, SpecError for one that cannot be cut down, ClusterError from Slurm."""
    import statistics

    from hpctrain.jobspec.load import load_job
    from hpctrain.planning.history import run_step_times

    if not 3 <= steps <= 10_000:
        raise UsageError(f"--measure-steps {steps}: from 3 to 10000", hint="--measure-steps 40")
    job = load_job(spec, overrides, cluster=cluster)
    if not job.spec.runs_trainer:
        raise UsageError(
            f"{spec}: --measure cuts the built-in trainer's run down to {steps} steps; a script or entry point "
            "counts its own steps",
            hint="run the spec once (the plan reads its logged steps), or give --step-time SECONDS",
        )
    if job.is_study or job.spec.sweep:
        raise UsageError(f"{spec}: --measure runs one spec, not a study or sweep", hint="measure its base spec")
    done = submit(spec, overrides=[*overrides, *measurement_overrides(steps)], cluster=cluster, wait=True)
    times = run_step_times(done.run_dir)
    if not times:
        raise RunDirError(
            f"the measurement (job {done.job_id}) ended {done.state or 'without a state'} and logged no step time",
            hint=f"see why: hpctrain logs {done.run_dir} --err",
        )
    return Measured(done.run_dir, done.job_id, done.state, statistics.median(times), len(times))
