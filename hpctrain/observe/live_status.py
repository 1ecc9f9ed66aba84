"""One look at a running job: what ``status`` and ``status --watch`` show, as a pure snapshot. Torch-free.

:func:`build_snapshot` turns what a run directory and Slurm say at one moment
(run.json, summary.json, the tail of metrics.jsonl, the ranks' heartbeats,
the newest checkpoint, the job's state) into a :class:`Snapshot`: progress,
rate, ETA, last checkpoint, restarts, data wait, each rank's last heartbeat
(stale ones flagged), stragglers and a hang. It does no I/O; :func:`read_run`
gathers its inputs, and the contract's :class:`MetricsTail` reads
``metrics.jsonl`` incrementally (``contract/metrics.py``), so a watch that polls for hours reads each line once and a
half-written last line waits for its newline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract.checkpoint_listing import checkpoint_meta, latest_checkpoint
from hpctrain.contract.heartbeat_files import Heartbeat, find_stragglers, read_heartbeats
from hpctrain.contract.metrics import MetricsTail
from hpctrain.contract.rundir import META_FILE, checkpoints_dir
from hpctrain.contract.runfiles import MAX_MAGNITUDE, printable
from hpctrain.contract.slurm_states import is_pending
from hpctrain.contract.step_split import brief
from hpctrain.contract.summary import Summary, read_summary
from hpctrain.observe.node_losses import burn_in_text, evictions_text, node_loss_text

HEARTBEAT_STALE_S = 120.0  # a running rank whose heartbeat is older than this is flagged


@dataclass(frozen=True)
class RankView:
    """One rank's last heartbeat, as a row of the rank table."""

    rank: int
    node: str
    step: int
    phase: str
    age_s: float
    step_time_median_s: float | None = None
    gpu_util_pct: float | None = None
    stale: bool = False
    straggler: bool = False


@dataclass(frozen=True)
class Snapshot:
    """Everything the live view shows at ``now``; None where the run has not said yet."""

    now: float
    name: str | None
    job_id: str | None
    slurm_state: str
    status: str | None  # the run's status (running, completed, stopped, failed) or pending/cancelled
    final: bool  # the job has ended and will not run again by itself
    epoch: int | None = None  # 1-based epoch being trained
    epochs: int | None = None
    step_in_epoch: int | None = None
    steps_per_epoch: int | None = None
    global_step: int | None = None
    total_steps: int | None = None
    images_per_s: float | None = None
    steps_per_s: float | None = None
    eta_s: float | None = None
    data_wait_fraction: float | None = None
    val_top1: float | None = None
    best_val_top1: float | None = None
    checkpoint_step: int | None = None
    checkpoint_age_s: float | None = None
    restarts: int | None = None
    ranks: tuple[RankView, ...] = ()
    stragglers: tuple[int, ...] = ()
    stale_ranks: tuple[int, ...] = ()
    hung_rank: int | None = None
    hung_node: str | None = None
    hung_phase: str | None = None
    failed_rank: int | None = None
    failed_node: str | None = None
    failed_reason: str | None = None
    stop_reason: str | None = None
    lost_nodes: str | None = None  # a healing run's lost nodes (observe/node_losses.py)
    burn_in: str | None = None  # the last burn-in
    evictions: str | None = None  # slow nodes evicted
    script: bool = False  # a script: job, which reports steps only through hpctrain.task
    step_split: str | None = None  # where the last log window's steps went (contract/step_split.brief)


@dataclass
class RunInputs:
    """What :func:`build_snapshot` needs from the run directory (gathered by :func:`read_run`)."""

    info: dict[str, Any]
    summary: Summary
    tail: MetricsTail
    heartbeats: list[Heartbeat] = field(default_factory=list)
    checkpoint: tuple[int, float] | None = None  # (global step, unix time its meta.json was written)


def read_run(run_dir: Path, info: dict[str, Any], tail: MetricsTail, summary: Summary | None = None) -> RunInputs:
    """Read the run's files once (``tail`` continues where it stopped); ``summary`` overrides summary.json."""
    tail.read()
    return RunInputs(
        info=info,
        summary=summary if summary is not None else (read_summary(run_dir) or Summary()),
        tail=tail,
        heartbeats=read_heartbeats(run_dir),
        checkpoint=last_checkpoint(run_dir),
    )


def last_checkpoint(run_dir: Path) -> tuple[int, float] | None:
    """(global step, write time) of the run's newest complete checkpoint."""
    latest = latest_checkpoint(checkpoints_dir(run_dir))
    if latest is None:
        return None
    meta = checkpoint_meta(latest) or {}
    step = meta.get("global_step")
    try:
        written = (latest / META_FILE).stat().st_mtime
    except OSError:
        return None
    return (step if isinstance(step, int) else int(latest.name.split("-")[1])), written


def build_snapshot(
    inputs: RunInputs, slurm_state: str, now: float, *, final: bool, stale_after_s: float = HEARTBEAT_STALE_S
) -> Snapshot:
    """The view of a run at ``now``. Pure: the same inputs give the same snapshot."""
    summary, tail = inputs.summary, inputs.tail
    last = tail.steps[-1] if tail.steps else None
    epochs = _int(summary.epochs)
    steps_per_epoch = _int(summary.steps_per_epoch)
    if steps_per_epoch is None and tail.last_epoch is not None:
        steps_per_epoch = _int(tail.last_epoch.get("step"))
    seen = (summary.global_step, last and last["global_step"], tail.last_epoch and tail.last_epoch["global_step"])
    global_step = max((step for step in seen if isinstance(step, int)), default=None)
    total = epochs * steps_per_epoch if epochs and steps_per_epoch else None
    total = _int(summary.total_steps) or total  # a user loop that stops before its last epoch says so
    rate = _step_rate(list(tail.steps))
    eta = None
    if total is not None and global_step is not None and not final:
        eta = max(0, total - global_step) / rate if rate else None
    epoch, step_in_epoch = _position(last, summary, steps_per_epoch, global_step)
    running = not final and not is_pending(slurm_state)
    ranks = rank_views(inputs.heartbeats, now, running=running, stale_after_s=stale_after_s)
    return Snapshot(
        now=now,
        name=_text(inputs.info.get("name")),
        job_id=_text(inputs.info.get("job_id")),
        slurm_state=slurm_state,
        status=summary.status,
        final=final,
        epoch=epoch,
        epochs=epochs,
        step_in_epoch=step_in_epoch,
        steps_per_epoch=steps_per_epoch,
        global_step=global_step,
        total_steps=total,
        images_per_s=_within(last.get("images_per_s"), 0.0, MAX_MAGNITUDE) if last else summary.train_images_per_s,
        steps_per_s=rate,
        eta_s=eta,
        data_wait_fraction=_within(last.get("data_wait_fraction"), 0.0, 1.0) if last else summary.data_wait_fraction,
        val_top1=summary.val_top1,
        best_val_top1=summary.best_val_top1,
        checkpoint_step=inputs.checkpoint[0] if inputs.checkpoint else None,
        checkpoint_age_s=max(0.0, now - inputs.checkpoint[1]) if inputs.checkpoint else None,
        restarts=summary.restarts,
        ranks=ranks,
        stragglers=tuple(view.rank for view in ranks if view.straggler),
        stale_ranks=tuple(view.rank for view in ranks if view.stale),
        hung_rank=summary.hung_rank,
        hung_node=_text(summary.hung_node),
        hung_phase=_text(summary.hung_phase),
        failed_rank=summary.failed_rank,
        failed_node=_text(summary.failed_node),
        failed_reason=_text(summary.failed_reason),
        script=isinstance((summary.model_extra or {}).get("script"), str),
        stop_reason=_text(summary.stop_reason),
        lost_nodes=node_loss_text(summary.node_failures),
        burn_in=burn_in_text(summary.burn_in),
        evictions=evictions_text(summary.evictions),
        step_split=brief(tail.last_split) if tail.last_split and not final else None,
    )


def rank_views(
    beats: list[Heartbeat], now: float, *, running: bool, stale_after_s: float = HEARTBEAT_STALE_S
) -> tuple[RankView, ...]:
    """Each rank's row; stale only while the job runs (an ended job's heartbeats are old by nature)."""
    stragglers = {beat.rank for beat in find_stragglers(beats)}
    return tuple(
        RankView(
            rank=beat.rank,
            node=printable(beat.node),
            step=beat.step,
            phase=printable(beat.phase),
            age_s=beat.age_s(now),
            step_time_median_s=beat.step_time_median_s,
            gpu_util_pct=beat.gpu_util_pct,
            stale=running and beat.phase != "done" and beat.age_s(now) > stale_after_s,
            straggler=beat.rank in stragglers,
        )
        for beat in beats
    )


def _step_rate(records: list[dict[str, Any]]) -> float | None:
    """Optimizer steps per second over the recent records (wall clock, so validation and saves count)."""
    timed = [record for record in records if isinstance(record.get("time"), (int, float))]
    if len(timed) < 2:
        return None
    steps = timed[-1]["global_step"] - timed[0]["global_step"]
    seconds = timed[-1]["time"] - timed[0]["time"]
    return steps / seconds if steps > 0 and seconds > 0 else None


def _position(
    last: dict[str, Any] | None, summary: Summary, steps_per_epoch: int | None, global_step: int | None
) -> tuple[int | None, int | None]:
    """(1-based epoch, steps done in it): from the newest train_step record, else from the summary."""
    if (
        last is not None
        and isinstance(last.get("epoch"), int)
        and isinstance(last.get("step"), int)
        and last["global_step"] == global_step
    ):
        return last["epoch"] + 1, last["step"]
    if steps_per_epoch and global_step is not None:
        done, into = divmod(global_step, steps_per_epoch)
        return (done, steps_per_epoch) if into == 0 and done else (done + 1, into)
    if summary.epochs_completed is not None:
        return summary.epochs_completed, None
    return None, None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _within(value: Any, low: float, high: float) -> float | None:
    """A number of the range a field can have (a share 0-1, a rate >= 0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        return None
    return float(value)


def _text(value: Any) -> str | None:
    """A string from a run file, safe to print (no terminal escapes); None stays None."""
    return None if value is None else printable(value)
