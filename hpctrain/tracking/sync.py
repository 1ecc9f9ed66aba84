"""``hpctrain sync RUN|STUDY``: send what is new in a run directory to each tracker its spec names.

The one sequence both faces call (``cli/cmd_sync.py``, ``hpctrain.sync``).
For each run (a study's points, a sweep's trials) and each tracker in its
``spec.yaml``'s ``tracking:`` section (read again at every sync, so a section
added after submit works):

1. read the tracker's cursor, the run's summary and its latest checkpoint;
2. read ``metrics.jsonl`` and plan the settled steps after the cursor
   (``plan.py``: the last value of each step; a step settles at a
   checkpoint or the run's end);
3. open the tracker run (the cursor's, or found by the tracking id, or new),
   send the parameters (the resolved spec) and the run's facts as tags,
   then the steps in batches, the report's figures, and the end;
4. after the tracker acknowledged, write the cursor (atomically): MLflow
   after each batch, W&B after ``finish``.

A sync killed anywhere sends nothing twice when run again: what the cursor
records was acknowledged, and what was acknowledged but not yet recorded is
the same data again (MLflow keeps it once; W&B offline is rewritten whole).
Login side, torch-free; tracker libraries are imported by their sink only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hpctrain.contract.checkpoint_listing import latest_checkpoint_step
from hpctrain.contract.rundir import (
    RUN_FILE,
    is_trial_dir,
    metrics_path,
    read_run_info,
    report_dir,
    run_home,
    spec_path,
    trial_dir,
)
from hpctrain.contract.runfiles import RunFileError, iter_lines
from hpctrain.contract.starts import read_starts
from hpctrain.contract.summary import FINAL_STATUSES, read_summary
from hpctrain.contract.tracking_state import Cursor, read_cursor, sync_lock, tracking_id, write_cursor
from hpctrain.errors import HpctrainError, RunDirError, SpecError, printable
from hpctrain.jobspec.tracking import Tracking
from hpctrain.jobspec.yaml_source import read_spec_file
from hpctrain.tracking.plan import (
    Batch,
    Event,
    History,
    StepValues,
    final_numbers,
    flat_params,
    late_events,
    plan_batch,
    read_history,
    run_events,
    run_tags,
    settled_step,
    step_times,
)

REPORT_FILES = ("*.png", "*.svg", "*.html", "*.md")
MAX_REPORT_FILES = 64
MIN_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Synced:
    """One run's state in one tracker after a sync."""

    run_dir: Path
    tracker: str
    where: str
    run_ref: str | None  # the tracker's id of the run
    sent: int  # steps sent by this sync
    through: int  # every step up to this one is in the tracker (-1: none yet)
    last_step: int | None  # the run's highest step so far
    final: str | None  # the run's end as the tracker has it
    waiting: str | None = None  # why steps were held back
    error: HpctrainError | None = None

    @property
    def complete(self) -> bool:
        """The run ended and the tracker has all of it."""
        return self.final is not None and self.error is None and self.through >= (self.last_step or -1)


@dataclass
class _Run:
    run_dir: Path
    spec: dict[str, Any]
    tracking: Tracking
    label: str
    ident: str
    final: str | None
    checkpoint: int | None
    summary: Any = None
    reports: list[Path] = field(default_factory=list)


def run_dirs(target: Path) -> list[Path]:
    """The run directories ``target`` stands for: a study's points, a sweep's trials, or itself."""
    from hpctrain.contract.study_file import point_dir, read_study, study_dir_of

    if (study := study_dir_of(target)) is not None:
        points = [point_dir(study, point) for point in read_study(study)["points"]]
        return [d for point in points if (point / RUN_FILE).exists() for d in run_dirs(point)]  # submitted ones
    info = read_run_info(target)
    trials = info.get("trials")
    if isinstance(trials, int) and not isinstance(trials, bool) and 0 < trials <= 100_000:
        return [trial_dir(target, index) for index in range(trials) if trial_dir(target, index).is_dir()]
    return [target]


def load_run(run_dir: Path, *, ended: bool = False) -> _Run:
    """What a sync needs of a run: its spec's tracking section, identity, end and latest checkpoint."""
    try:
        spec, _ = read_spec_file(spec_path(run_dir))
        tracking = Tracking.model_validate(spec.get("tracking") or {})
    except SpecError as exc:
        raise RunDirError(exc.message, hint="the run's resolved spec is RUN/spec.yaml") from None
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"])
        raise RunDirError(
            f"{spec_path(run_dir)}: tracking.{printable(where)}: {printable(problem['msg'])}",
            hint="fix the tracking: section of the run's spec.yaml (docs/tracking.md)",
        ) from None
    if not tracking.trackers:
        raise RunDirError(
            f"{run_dir}: its spec names no tracker (no tracking: section)",
            hint="add tracking: {mlflow: {tracking_uri: ...}} or {wandb: {project: ...}} to the spec for the next "
            "runs; for this one, add it to RUN/spec.yaml (read at every sync; docs/tracking.md)",
        )
    summary = read_summary(run_dir)
    final = run_end(run_dir)
    if final is None and ended:  # the caller knows the run will not go on (Slurm may still call it running)
        final = summary.status if summary is not None and summary.status in FINAL_STATUSES else "stopped"
    name = str(spec.get("name") or run_dir.parent.name)
    label = f"{name}/{run_dir.parent.name}/{run_dir.name}" if is_trial_dir(run_dir) else f"{name}/{run_dir.name}"
    folder = report_dir(run_dir)
    reports = (
        sorted(p for pattern in REPORT_FILES for p in folder.glob(pattern) if p.is_file()) if folder.is_dir() else []
    )
    return _Run(
        run_dir, spec, tracking, label, tracking_id(run_dir), final, latest_checkpoint_step(run_dir), summary,
        reports[:MAX_REPORT_FILES],
    )  # fmt: skip


def run_end(run_dir: Path) -> str | None:
    """How the run ended (completed, stopped, failed), or None while it may go on.

    ``status``'s rule (launch/run_state.py: the summary, reconciled with Slurm's state: a
    job that died without writing its end has failed), and one more: a run whose job Slurm
    will still start (a requeue after a time limit or a preemption leaves summary.json saying
    "stopped" while the job is PENDING again) has not ended. Where Slurm cannot be asked (a
    run directory copied to a laptop), the summary says it.
    """
    from hpctrain.contract.slurm_states import run_state as slurm_run_state
    from hpctrain.launch.run_state import display_status, run_state

    _, state, summary = run_state(run_dir)
    if slurm_run_state(state) in ("pending", "running", "ending"):
        return None  # the job runs, or will run again
    status = display_status(summary.status, state)
    return status if status in FINAL_STATUSES else None


def _sink(tracker: str, tracking: Tracking) -> Any:
    if tracker == "mlflow":
        from hpctrain.tracking.mlflow_sink import MlflowSink

        return MlflowSink(tracking.mlflow)
    from hpctrain.tracking.wandb_sink import WandbSink

    return WandbSink(tracking.wandb)


def _lines(run_dir: Path) -> Iterator[bytes]:
    path = metrics_path(run_dir)
    try:
        yield from iter_lines(path, within=run_home(run_dir))
    except FileNotFoundError:
        return
    except (OSError, RunFileError) as exc:
        raise RunDirError(f"{path}: unreadable ({exc})") from None


def sync_tracker(run: _Run, tracker: str, sink: Any = None) -> Synced:
    """Send ``run``'s new settled steps (and params, facts, figures, end) to ``tracker``; write the cursor.
    A run another sync is sending to ``tracker`` right now is left to it (``waiting`` says so)."""
    sink = sink if sink is not None else _sink(tracker, run.tracking)
    with sync_lock(run.run_dir, tracker) as mine:
        if mine:
            return _sync_locked(run, tracker, sink)
    saved = read_cursor(run.run_dir, tracker)
    busy = f"another 'hpctrain sync' is sending this run to {tracker} now; left to it"
    return Synced(run.run_dir, tracker, sink.where, saved.run_ref, 0, saved.sent_step, None, saved.final, busy)


def _sync_locked(run: _Run, tracker: str, sink: Any) -> Synced:
    saved = read_cursor(run.run_dir, tracker)
    work = Cursor(tracker, run_ref=saved.run_ref) if sink.rewrites else replace(saved)
    plan = _plan(run, work, saved)
    if not _news(plan, saved, run.final, rewrites=sink.rewrites):
        return Synced(run.run_dir, tracker, sink.where, saved.run_ref, 0, saved.sent_step, plan.history.max_step,
                      saved.final, plan.waiting)  # fmt: skip
    work.run_ref, server_through = sink.open(run.ident, work.run_ref, run.label, run.run_dir)
    if server_through is not None and server_through > work.sent_step:  # the cursor was lost: the run's tag says
        work.sent_step, work.sent_bytes = server_through, 0
        plan = _plan(run, work, saved)
    new_params = {k: v for k, v in plan.params.items() if k not in work.params}
    changed = {f"hpctrain.changed.{k}"[:250]: v for k, v in plan.params.items() if work.params.get(k, v) != v}
    if new_params:
        sink.send_params(new_params)
    if plan.tags != work.tags or changed:
        sink.set_tags({**plan.tags, **changed})
    work.params, work.tags, work.late_steps = dict(plan.params), plan.tags, plan.late

    def acknowledged() -> None:
        if sink.acks_each_batch:
            write_cursor(run.run_dir, work)

    if plan.stray:  # at their steps' own times (or their records'): a resend after a kill is the same data
        known = step_times(_lines(run.run_dir), {e.step for e in plan.stray if e.time is None})
        stray = [
            StepValues(e.step, e.time if e.time is not None else known.get(e.step, 0.0), {e.metric: e.value})
            for e in plan.stray
        ]
        sink.send_steps(stray, through=work.sent_step)
        work.events += [e.key for e in plan.stray]
        acknowledged()
    batch = plan.batch
    recorded = 0  # steps of the batches the cursor holds: this sync sent them, whatever fails after
    try:
        for chunk in _chunks(batch.steps):
            through = batch.through if chunk[-1] is batch.steps[-1] else chunk[-1].step
            sink.send_steps(chunk, through=through)
            work.sent_step, work.sent_bytes = through, plan.history.size
            work.events += [e.key for e in batch.events if e.step <= through and e.key not in work.events]
            acknowledged()
            recorded += len(chunk) if sink.acks_each_batch else 0
        work.sent_step = max(work.sent_step, batch.through)
        fresh = {key: path for key, path in plan.artifacts.items() if key not in work.artifacts}
        if fresh:
            sink.send_artifacts(list(fresh.values()))
            work.artifacts += list(fresh)
        if run.final != saved.final or sink.rewrites:
            numbers = final_numbers(run.summary) if run.final and run.summary else {}
            sink.finish(run.final, numbers, plan.history.max_step, time.time())
    except HpctrainError as exc:
        if not recorded:
            raise
        # a later batch, the figures or the end failed: the steps already recorded were sent, by this sync
        return Synced(run.run_dir, tracker, sink.where, work.run_ref, recorded, work.sent_step,
                      plan.history.max_step, saved.final, plan.waiting, error=exc)  # fmt: skip
    work.final = run.final
    sink.close()
    write_cursor(run.run_dir, work)
    return Synced(run.run_dir, tracker, sink.where, work.run_ref, len(batch.steps), work.sent_step,
                  plan.history.max_step, work.final, plan.waiting)  # fmt: skip


@dataclass
class _Plan:
    history: History
    batch: Batch
    stray: list[Event]  # events at steps already sent (MLflow takes them at their step)
    tags: dict[str, str]
    params: dict[str, str]
    late: list[int]
    artifacts: dict[str, Path]
    waiting: str | None


def _plan(run: _Run, work: Cursor, saved: Cursor) -> _Plan:
    history = read_history(_lines(run.run_dir), after_step=work.sent_step, sent_bytes=work.sent_bytes)
    settled = settled_step(history, run.checkpoint, run.final is not None)
    events = run_events(history, run.summary, read_starts(run.run_dir))
    late = sorted({*saved.late_steps, *history.late})
    batch = plan_batch(history, events, after_step=work.sent_step, settled=settled, sent=work.events)
    stray = late_events(events, after_step=work.sent_step, sent=work.events) if work.sent_step >= 0 else []
    artifacts = {f"{p.name}:{p.stat().st_size}:{int(p.stat().st_mtime)}": p for p in run.reports} if run.final else {}
    return _Plan(
        history, batch, stray, run_tags(run.summary, history, late), flat_params(run.spec), late, artifacts,
        _waiting(history.max_step, batch.through),
    )  # fmt: skip


def _news(plan: _Plan, saved: Cursor, final: str | None, *, rewrites: bool) -> bool:
    """Whether the tracker lacks anything: steps, events, facts, parameters, figures or the run's end."""
    steps = plan.batch.through > saved.sent_step if rewrites else bool(plan.batch.steps or plan.stray)
    return bool(
        steps or plan.tags != saved.tags or plan.params != saved.params or final != saved.final
        or set(plan.artifacts) - set(saved.artifacts)
    )  # fmt: skip


def _chunks(steps: list[StepValues], limit: int = 900) -> Iterator[list[StepValues]]:
    chunk: list[StepValues] = []
    count = 0
    for entry in steps:
        if chunk and count + len(entry.values) > limit:
            yield chunk
            chunk, count = [], 0
        chunk.append(entry)
        count += len(entry.values)
    if chunk:
        yield chunk


def _waiting(last: int | None, through: int) -> str | None:
    if last is None or through >= last:
        return None
    return (
        f"steps {through + 1}-{last} wait for the next checkpoint or the run's end (a restart may redo them; "
        "'--ended' sends them for a run that will not go on)"
    )


def resolve_target(run: str) -> Path:
    """A study directory, a run directory or a Slurm job id -> the directory to sync."""
    from hpctrain.contract.job_registry import resolve_run
    from hpctrain.contract.study_file import study_dir_of

    study = study_dir_of(run)
    return study if study is not None else resolve_run(run)


def sync(
    target: Path,
    *,
    follow: bool = False,
    interval_s: float = 30.0,
    ended: bool = False,
    on_result: Callable[[Synced], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Synced]:
    """Sync every run of ``target`` with each of its trackers; ``follow``: again every ``interval_s``
    until every run ended and is in its trackers whole (a tracker that cannot be reached is tried again;
    a run whose spec names no tracker is not waited for). One run's error does not stop the others."""
    while True:
        results = []
        for run_dir in run_dirs(target):
            try:
                run = load_run(run_dir, ended=ended)
            except HpctrainError as exc:
                results.append(Synced(run_dir, "-", "-", None, 0, -1, None, None, error=exc))
                if on_result is not None:
                    on_result(results[-1])
                continue
            for tracker in run.tracking.trackers:
                try:
                    result = sync_tracker(run, tracker)
                except HpctrainError as exc:
                    result = Synced(run_dir, tracker, tracker, None, 0, -1, None, None, error=exc)
                results.append(result)
                if on_result is not None:
                    on_result(result)
        if not follow or all(result.complete or result.tracker == "-" for result in results):  # "-": its spec
            return results
        sleep(max(MIN_INTERVAL_S, interval_s))
