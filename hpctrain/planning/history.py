"""This spec's earlier runs and study points, as evidence for a plan: step times, an epoch's samples, restarts.

A run counts when its resolved ``spec.yaml`` trains the same thing on the same
kind of node (:data:`SAME`: model, per-device batch, precision, strategy,
data path, image size, the script or entry point, the cluster profile, GPUs
and tasks per node); its node count may differ -- that is what a plan
compares. Every file is read through ``contract/``'s readers, which are
bounded and refuse what leads out of the run (a symlink, a FIFO, a huge or
deeply nested file): the run directories are shared and anyone may have
written them. What cannot be read is skipped and counted in the notes.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.metrics import parse_metric_lines
from hpctrain.contract.rundir import is_inside, is_study_dir, metrics_path, run_home, spec_path
from hpctrain.contract.runfiles import RunFileError, plausible, printable, read_tail
from hpctrain.contract.scaling_model import Scale, run_devices, scale_of
from hpctrain.contract.starts import Start, read_starts
from hpctrain.contract.step_split import KIND as SPLIT_KIND
from hpctrain.contract.study_file import point_dir, read_study
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.errors import HpctrainError, SpecError
from hpctrain.jobspec.yaml_source import read_spec_file
from hpctrain.planning.step_time import Measurement

# The keys two runs must share for one's step time to stand for the other's.
SAME = (
    "cluster",
    "entrypoint",
    "script",
    "trainer.arch",
    "trainer.batch_size",
    "trainer.precision",
    "trainer.strategy",
    "trainer.channels_last",
    "trainer.compile",
    "data.root",
    "data.image_size",
    "resources.gpus_per_node",
    "resources.tasks_per_node",
)
MAX_RUNS = 64  # the newest run directories of the spec that are looked at
METRICS_TAIL_BYTES = 4 << 20  # of each run's metrics.jsonl, only the end is read
MIN_STEPS = 3  # logged step times a measurement needs


@dataclass
class History:
    """What earlier runs of the spec say: step times per node count, an epoch's samples, a total."""

    measurements: list[Measurement] = field(default_factory=list)
    samples_per_epoch: tuple[int, str] | None = None  # (samples, which run)
    total_steps: tuple[int, str] | None = None
    restart_costs: list[float] = field(default_factory=list)  # each later start's cost (contract/starts.py)
    first_start_costs: list[float] = field(default_factory=list)  # each run's first start's
    started_runs: int = 0  # runs whose starts gave a cost
    looked_at: int = 0
    notes: list[str] = field(default_factory=list)


def key_of(spec: Mapping[str, Any]) -> tuple[Any, ...]:
    """The values of :data:`SAME` in a (resolved) spec mapping."""
    return tuple(dotted(spec, key) for key in SAME)


def history(spec_home: Path, spec: Mapping[str, Any], *, max_runs: int = MAX_RUNS) -> History:
    """Earlier runs under ``spec_home`` (OUTPUT_DIR/NAME) that match ``spec`` (its resolved mapping); the
    newest ``max_runs`` folders are looked at."""
    found = History()
    wanted = key_of(spec)
    for run_dir in _run_dirs(spec_home, found, max_runs):
        found.looked_at += 1
        earlier = read_run_spec(run_dir)
        if earlier is None or key_of(earlier) != wanted:
            continue
        _read_run(run_dir, earlier, found)
    return found


def _run_dirs(spec_home: Path, found: History, max_runs: int = MAX_RUNS) -> Iterator[Path]:
    try:
        children = sorted((p for p in spec_home.iterdir() if p.is_dir() and not p.is_symlink()), reverse=True)
    except OSError:
        return
    for child in children[:max_runs]:
        if is_study_dir(child):
            try:
                points = read_study(child)["points"]
            except HpctrainError as exc:
                found.notes.append(f"skipped study {child}: {exc.message}")
                continue
            yield from (point_dir(child, point) for point in points)
        else:
            yield child


def read_run_spec(run_dir: Path) -> dict[str, Any] | None:
    path = spec_path(run_dir)
    if not path.is_file() or not is_inside(path, run_home(run_dir)):
        return None
    try:
        data, _positions = read_spec_file(path)
    except SpecError:
        return None
    return data


def _read_run(run_dir: Path, spec: Mapping[str, Any], found: History) -> None:
    summary = read_summary(run_dir)
    nodes = summary.num_nodes if summary and summary.num_nodes else dotted(spec, "resources.nodes")
    where = printable(str(run_dir))
    records = metric_records(run_dir, found)
    starts = read_starts(run_dir)
    pace = pace_of(records, starts)
    if isinstance(nodes, int) and nodes >= 1 and pace is not None and pace.steps >= MIN_STEPS:
        scale = _scale(records, summary, spec, nodes)
        found.measurements.append(Measurement(nodes, pace.seconds, pace.steps, where, scale, pace.basis))
    _read_starts(starts, None if pace is None else pace.median_s, found)
    if summary is None:
        return
    per_epoch, batch, cap = (
        summary.steps_per_epoch,
        summary.global_batch_size,
        dotted(spec, "trainer.max_steps_per_epoch"),
    )
    capped = isinstance(cap, int) and per_epoch is not None and per_epoch >= cap
    if found.samples_per_epoch is None and per_epoch and batch and per_epoch > 0 and batch > 0 and not capped:
        found.samples_per_epoch = (per_epoch * batch, where)
    if found.total_steps is None and summary.total_steps and summary.total_steps > 0:
        found.total_steps = (summary.total_steps, where)


def _read_starts(starts: Sequence[Start], step_s: float | None, found: History) -> None:
    """Each recorded start's cost (its start-up, and its redone steps at the run's median step time)."""
    costs = [(start.first, cost) for start in starts if (cost := start.cost_s(step_s)) is not None]
    if costs:
        found.started_runs += 1
    for first, cost in costs:
        (found.first_start_costs if first else found.restart_costs).append(cost)


@dataclass(frozen=True)
class Pace:
    """How long a run took per training step: ``basis`` "wall" is the wall time between its logged steps
    within each start (what a plan must count: the validation, checkpoints and epoch starts between steps
    too), "median" the median of its logged step times where too few steps were logged in a row."""

    seconds: float
    steps: int
    basis: str
    median_s: float  # the median of the logged step times either way (a restart's redone steps cost it)


# Without a starts record (a run older than contract/starts.py), a pause this long between two logged steps
# is taken for a restart, not for what a run does between steps (a long validation).
RESTART_GAP_S = 600.0


def pace_of(records: list[dict[str, Any]], starts: Sequence[Start] = ()) -> Pace | None:
    """The run's seconds per step from its train_step records (file order) and its starts; None: no step."""
    times = step_times_of(records)
    if not times:
        return None
    median = statistics.median(times)
    logged = [
        (r["global_step"], r["time"])
        for r in records
        if r["kind"] == "train_step" and isinstance(r.get("global_step"), int) and plausible(r.get("time"))
    ]
    restarts = sorted(start.began for start in starts if not start.first)
    span, steps = 0.0, 0
    for (step_before, before), (step, at) in zip(logged, logged[1:]):
        advanced, took = step - step_before, at - before
        if advanced <= 0 or took < 0 or any(before < began <= at for began in restarts):
            continue  # steps redone after a restart, a clock step back, or a restart in between
        if not starts and took > max(RESTART_GAP_S, 100 * median * advanced):
            continue
        span, steps = span + took, steps + advanced
    if steps >= MIN_STEPS and span > 0:
        return Pace(span / steps, steps, "wall", median)
    return Pace(median, len(times), "median", median)


def run_pace(run_dir: Path) -> Pace | None:
    """:func:`pace_of` a run directory (bounded reads, as everywhere here)."""
    return pace_of(metric_records(run_dir), read_starts(run_dir))


def run_step_times(run_dir: Path, found: History | None = None) -> list[float]:
    """The logged step times (``step_s`` of train_step records) at the end of the run's metrics.jsonl; what
    cannot be read is noted in ``found``."""
    return step_times_of(metric_records(run_dir, found))


def step_times_of(records: list[dict[str, Any]]) -> list[float]:
    return [
        r["step_s"]
        for r in records
        if r["kind"] == "train_step" and plausible(r.get("step_s")) and 0 < r["step_s"] < 86400
    ]


def metric_records(run_dir: Path, found: History | None = None) -> list[dict[str, Any]]:
    """The train_step and step_split records at the end of the run's metrics.jsonl, in file order."""
    path = metrics_path(run_dir)
    if not path.exists():
        return []
    try:
        tail = read_tail(path, METRICS_TAIL_BYTES, within=run_home(run_dir))
    except (OSError, RunFileError) as exc:
        if found is not None:
            found.notes.append(f"skipped {printable(str(path))}: {exc}")
        return []
    lines = tail.splitlines(keepends=True)
    if len(tail) >= METRICS_TAIL_BYTES and lines:
        lines = lines[1:]  # the first piece may be the end of a longer line
    records, _notes = parse_metric_lines(lines, kinds=("train_step", SPLIT_KIND), timed=False)
    return records


def _scale(records: list[dict[str, Any]], summary: Summary | None, spec: Mapping[str, Any], nodes: int) -> Scale | None:
    """The run's measured split as a scale of the what-if model (devices as the report counts them), or None."""
    latest: dict[Any, dict[str, Any]] = {}
    for record in records:  # a window logged again after a restart: the later one, as the report keeps
        if record["kind"] == SPLIT_KIND:
            latest[record.get("global_step")] = record
    if not latest:
        return None
    gpn = dotted(spec, "resources.gpus_per_node")
    world = summary.world_size if summary is not None else None
    on_cpu = summary is not None and isinstance(summary.device, str) and summary.device.startswith("cpu")
    devices, _kind = run_devices(nodes, gpn if isinstance(gpn, int) else None, world, on_cpu)
    batch = summary.global_batch_size if summary is not None else None
    return scale_of(list(latest.values()), devices=devices, global_batch=batch)


def dotted(data: Mapping[str, Any], key: str) -> Any:
    value: Any = data
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return value
