"""Read runs, sweeps and studies into plain dataclasses for the report. Torch-free.

Everything a run directory says is read here and nowhere else in the report:
``metrics.jsonl`` (train_step / epoch / val records, parsed by contract/metrics.py),
``summary.json``, ``run.json``, ``spec.yaml``, ``heartbeats/`` and a study's
``study.json``. Damage is tolerated and noted, never raised: a half-written
last line, garbage lines and non-finite numbers are skipped (and counted in
``RunData.notes``). Only arguments that are not runs at all raise
``RunDirError``.

Attempts (restarts): a requeued or resumed run appends to the same
metrics.jsonl and replays the steps since its last checkpoint. A new attempt
starts where a train_step's global step does not increase over the previous
one (a replay). When ``summary.json``'s ``restarts`` (or run.json's list of
job ids) counts more restarts than replays were seen (the checkpoint fell
on a logged step, so nothing was replayed), the largest unexplained time gaps
before a train_step (gap minus the logged window's own duration) are taken
as the remaining starts. Readers keep the last record per global step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract import job_registry
from hpctrain.contract.estimates import read_estimates
from hpctrain.contract.heartbeat_files import read_heartbeats, straggler_medians
from hpctrain.contract.metrics import parse_metric_lines
from hpctrain.contract.rundir import (
    METRICS_FILE,
    RUN_FILE,
    SPEC_FILE,
    SUMMARY_FILE,
    is_inside,
    is_study_dir,
    is_trial_dir,
    metrics_path,
    read_json_object,
    run_home,
    spec_path,
    summary_path,
)
from hpctrain.contract.runfiles import RunFileError, iter_lines, plausible, printable, real_path
from hpctrain.contract.step_split import KIND as SPLIT_KIND
from hpctrain.contract.summary import FINAL_STATUSES, parse_summary
from hpctrain.errors import RunDirError, SpecError
from hpctrain.jobspec.yaml_source import read_spec_file
from hpctrain.observe.start_costs import start_lines
from hpctrain.planning.forecast import compare

KINDS = ("train_step", "epoch", "val")  # the records a report plots (gpu samples are not)


@dataclass
class RunData:
    """One run (or one sweep trial) as the report sees it."""

    path: Path
    label: str
    info: dict[str, Any] = field(default_factory=dict)  # run.json (the sweep's for a trial)
    summary: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    point: dict[str, Any] | None = None  # the study point this run measures
    train: list[dict[str, Any]] = field(default_factory=list)  # each record has "attempt" added
    epochs: list[dict[str, Any]] = field(default_factory=list)
    vals: list[dict[str, Any]] = field(default_factory=list)
    downtimes: list[tuple[float, float]] = field(default_factory=list)  # (last record, next attempt's first)
    restarts: int = 0
    stragglers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    predicted: str = ""  # the estimate submit gave against what happened (planning/forecast.py)
    starts: list[str] = field(default_factory=list)  # each start's cost in words (observe/start_costs.py)
    splits: list[dict[str, Any]] = field(default_factory=list)  # step_split records (contract/step_split.py)
    nodes: dict[int, str] = field(default_factory=dict)  # rank -> node, from the heartbeats

    @property
    def has_metrics(self) -> bool:
        return bool(self.train or self.epochs or self.vals)

    @property
    def start_time(self) -> float | None:
        times = [r["time"] for r in (*self.train, *self.epochs, *self.vals)]
        return min(times) if times else None

    @property
    def restart_times(self) -> list[float]:
        """Unix time each later attempt logged its first record."""
        return [start for _end, start in self.downtimes]

    def active_s(self, until: float) -> float:
        """Seconds from the first record to ``until``, not counting the time between attempts."""
        start = self.start_time or until
        idle = sum(max(0.0, min(b, until) - a) for a, b in self.downtimes if a < until)
        return max(0.0, until - start - idle)

    @property
    def steps_per_epoch(self) -> int | None:
        steps = [r.get("step") for r in self.epochs] or [r.get("step") for r in self.train]
        steps = [s for s in steps if isinstance(s, int) and s > 0]
        return max(steps) if steps else None

    @property
    def desired_acc(self) -> float | None:
        trainer = self.spec.get("trainer")
        value = trainer.get("desired_acc") if isinstance(trainer, dict) else None
        return float(value) if plausible(value) else None


# ------------------------------------------------------------------ metrics.jsonl


def parse_metrics(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The metric records of ``text`` in file order, and notes on what was skipped."""
    return parse_metric_lines(text.encode().splitlines(keepends=True), kinds=KINDS)


def split_attempts(records: list[dict[str, Any]], expected_restarts: int = 0) -> list[int]:
    """Indexes into ``records`` where a new attempt starts (see the module docstring)."""
    starts: set[int] = set()
    gaps: list[tuple[float, int]] = []
    previous_step: int | None = None
    for index, record in enumerate(records):
        if record["kind"] != "train_step":
            continue
        step = record.get("global_step")
        if isinstance(step, int) and previous_step is not None and step <= previous_step:
            starts.add(index)
        if isinstance(step, int):
            previous_step = step
        if index > 0:
            span = (record.get("step_s") or 0.0) * max(1, _window_steps(records, index))
            gaps.append((record["time"] - records[index - 1]["time"] - span, index))
    missing = expected_restarts - len(starts)
    for _gap, index in sorted(gaps, reverse=True):
        if missing <= 0:
            break
        if index not in starts:
            starts.add(index)
            missing -= 1
    return sorted(starts)


def _window_steps(records: list[dict[str, Any]], index: int) -> int:
    """How many optimizer steps the train_step record at ``index`` averages over."""
    step = records[index].get("global_step")
    for back in range(index - 1, -1, -1):
        earlier = records[back]
        if earlier["kind"] == "train_step" and isinstance(earlier.get("global_step"), int):
            if isinstance(step, int) and step > earlier["global_step"]:
                return step - earlier["global_step"]
            break
    in_epoch = records[index].get("step")
    return in_epoch if isinstance(in_epoch, int) and in_epoch > 0 else 1


def _latest_per_key(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    latest: dict[Any, dict[str, Any]] = {}
    for record in records:
        latest[record.get(key)] = record
    return sorted(latest.values(), key=lambda r: r["time"])


def attach_metrics(run: RunData, lines: Iterable[bytes]) -> None:
    """Fill ``run``'s series, attempts and restart count from metrics.jsonl's ``lines``."""
    records, notes = parse_metric_lines(lines, kinds=(*KINDS, SPLIT_KIND))
    run.notes.extend(notes)
    splits = [r for r in records if r["kind"] == SPLIT_KIND]
    records = [r for r in records if r["kind"] != SPLIT_KIND]
    job_ids = run.info.get("job_ids")
    expected = max(_int(run.summary.get("restarts")), len(job_ids) - 1 if isinstance(job_ids, list) else 0, 0)
    starts = split_attempts(records, expected)
    attempt, boundaries = 0, set(starts)
    for index, record in enumerate(records):
        if index in boundaries:
            attempt += 1
        record["attempt"] = attempt
    run.downtimes = [(records[i - 1]["time"] if i else records[i]["time"], records[i]["time"]) for i in starts]
    run.restarts = max(expected, len(starts))
    by_kind = {kind: [r for r in records if r["kind"] == kind] for kind in KINDS}
    run.train = _latest_per_key(by_kind["train_step"], "global_step")
    run.epochs = _latest_per_key(by_kind["epoch"], "epoch")
    run.vals = _latest_per_key(by_kind["val"], "epoch")
    for record in splits:  # the attempt of the train records it follows
        record["attempt"] = next((r["attempt"] for r in reversed(records) if r["time"] <= record["time"]), 0)
    run.splits = _latest_per_key(splits, "global_step")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and plausible(value) else 0


# ------------------------------------------------------------------ one run


def _read_spec(path: Path) -> dict[str, Any]:
    """The run's resolved spec.yaml as plain data (the spec reader's bounds: size, aliases, nesting), else {};
    never through a symlink out of the run."""
    if not is_inside(path, run_home(path.parent)):
        return {}
    try:
        data, _positions = read_spec_file(path)
    except SpecError:
        return {}
    return data


def load_run(
    path: Path, label: str, *, info: dict[str, Any] | None = None, point: dict[str, Any] | None = None
) -> RunData:
    """Everything the report needs from one run directory; never raises on damaged files."""
    run = RunData(path=path, label=label, info=dict(info or {}), point=point)
    run.summary = read_json_object(summary_path(path), within=run_home(path)) or {}
    run.spec = _read_spec(spec_path(path))
    attach_metrics(run, _metric_lines(run, metrics_path(path), run_home(path)))
    if not run.summary and summary_path(path).exists():
        run.notes.append("summary.json unreadable")
    outcome = compare(read_estimates(path), parse_summary(run.summary))
    run.predicted = "" if outcome is None else outcome.line()
    run.starts = start_lines(path, _median_step_s(run.train))
    beats = read_heartbeats(path)
    run.nodes = {beat.rank: printable(beat.node) for beat in beats if beat.node}
    for beat, typical in straggler_medians(beats):
        run.stragglers.append(
            f"rank {beat.rank} on {printable(beat.node or '?')}: median step {beat.step_time_median_s:.3f} s"
            f" vs {typical:.3f} s on the other ranks"
        )
    return run


def _median_step_s(train: list[dict[str, Any]]) -> float | None:
    times = sorted(r["step_s"] for r in train if plausible(r.get("step_s")) and r["step_s"] > 0)
    return times[len(times) // 2] if times else None


def no_metrics_note(summary: dict[str, Any]) -> str:
    """Why a run has no curves, and what would add them: a script logs its own through ``hpctrain.task.log``."""
    script = isinstance(summary.get("script"), str)
    if summary.get("status") in FINAL_STATUSES:
        said = "no metrics.jsonl: the run ended without logging a training step"
    else:
        said = "no metrics.jsonl yet: the run has not logged a training step"
    if script:
        said += "; a script adds curves with hpctrain.task.log(step, loss=...) (docs/your-own-loop.md)"
    return said


def _metric_lines(run: RunData, path: Path, within: Path) -> Iterator[bytes]:
    """metrics.jsonl streamed line by line (a note on ``run`` when it cannot be read)."""
    try:
        yield from iter_lines(path, within=within)
    except FileNotFoundError:
        run.notes.append(no_metrics_note(run.summary))
    except OSError as exc:
        run.notes.append(f"metrics.jsonl unreadable: {exc.strerror}")
    except RunFileError as exc:
        run.notes.append(f"metrics.jsonl not read: {exc.message}")


# ------------------------------------------------------------------ arguments -> runs


def _trial_dirs(path: Path) -> list[Path]:
    try:
        return sorted(child for child in path.iterdir() if child.is_dir() and is_trial_dir(child))
    except OSError:
        return []


def _looks_like_run(path: Path) -> bool:
    return any((path / name).exists() for name in (RUN_FILE, METRICS_FILE, SUMMARY_FILE, SPEC_FILE))


def _run_or_sweep(path: Path, label: str, point: dict[str, Any] | None = None) -> list[RunData]:
    info = read_json_object(path / RUN_FILE, within=path) or {}
    trials = _trial_dirs(path)
    if trials:
        return [load_run(t, f"{label}/{t.name}", info=info, point=point) for t in trials]
    return [load_run(path, label, info=info, point=point)]


def _load_study(path: Path) -> list[RunData]:
    from hpctrain.contract.study_file import point_dir, read_study

    runs: list[RunData] = []
    for index, point in enumerate(read_study(path)["points"]):
        label = str(point.get("label") or f"point-{index}")
        run_dir = point_dir(path, point)
        if not run_dir.is_dir():
            missing = RunData(path=run_dir, label=label, point=point)
            missing.notes.append(f"{run_dir.name}/ does not exist (the point was never submitted or was removed)")
            runs.append(missing)
            continue
        runs.extend(_run_or_sweep(run_dir, label, point))
    return runs


def load_targets(paths: list[Path]) -> list[RunData]:
    """The runs behind the command's arguments: run dirs, sweep dirs (trial-NNN/) or study dirs."""
    runs: list[RunData] = []
    for raw in paths:
        path = Path(raw).expanduser()
        if not path.exists() and str(raw).replace("_", "").isdigit():
            path = job_registry.resolve_run(str(raw))  # a Slurm job id this account submitted
        if not path.exists():
            raise RunDirError(
                f"{raw}: not an hpctrain run directory (it does not exist)",
                hint="pass a run, sweep or study directory (OUTPUT_DIR/NAME/RUN_ID)",
            )
        if not path.is_dir():
            raise RunDirError(f"{raw}: not a directory", hint="pass the run directory, not a file in it")
        if is_study_dir(path):
            runs.extend(_load_study(path))
        elif _looks_like_run(path) or _trial_dirs(path):
            runs.extend(_run_or_sweep(path, _default_label(path)))
        else:
            raise RunDirError(
                f"{raw}: not an hpctrain run directory (no run.json, metrics.jsonl or study.json)",
                hint="pass a directory OUTPUT_DIR/NAME/RUN_ID created by 'hpctrain submit', or a study directory",
            )
    _disambiguate(runs)
    return runs


def _default_label(path: Path) -> str:
    resolved = real_path(path)
    return f"{resolved.parent.name}/{resolved.name}" if resolved.parent.name else resolved.name


def _disambiguate(runs: list[RunData]) -> None:
    seen: dict[str, int] = {}
    for run in runs:
        count = seen.get(run.label, 0)
        seen[run.label] = count + 1
        if count:
            run.label = f"{run.label} ({count + 1})"
